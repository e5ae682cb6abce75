"""Kernel families, one module per owner: each module here defines ``FAMILIES = (KernelFamily(...), ...)``.
:func:`lucegen.codegen.all_families` imports every module in this package; see lucegen.codegen for the contract."""
