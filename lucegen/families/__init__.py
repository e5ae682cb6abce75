"""Kernel families, one module per owner: each module here defines ``FAMILIES = (KernelFamily(...), ...)`` (the
dataclass and shared helpers are in :mod:`.base`) with the functions that build its template parameters for a target
and a model shape. :func:`lucegen.codegen.all_families` imports every module in this package; see lucegen.codegen
for the contract."""
