"""Kernel signatures declared as data (lucegen.kernel_signature): the C parameter list rendered from a declaration,
and a launch's named arguments bound to it (lucegen.runtime.device.bind_arguments)."""

import re

import numpy as np
import pytest

from lucegen.errors import DeviceError
from lucegen.kernel_signature import (KernelSignature, SignatureError, find, parameter_name, pointer, scalar,
                                      source_parameters, struct)
from lucegen.runtime.device import Buffer, ByValue, TensorMap, address, bind_arguments

RMSNORM = KernelSignature("rmsnorm_{dtype}", (
    pointer("x", "{T}", const=True), pointer("w", "{T}", const=True), pointer("y", "{T}"),
    scalar("n", "int"), scalar("eps", "float")))

GEMM = KernelSignature("gemm_m{bm}", (
    pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("out", "float", restrict=False),
    scalar("stride", "size_t"), scalar("epoch", "unsigned"), scalar("n", "long long"),
    struct("map_a", "GemmTensorMap", 128, when="tma"), struct("map_w", "GemmTensorMap", 128, when="tma")))


def test_render_writes_the_c_parameter_list():
    assert RMSNORM.render("rmsnorm_bf16", {"T": "bf16_t"}) == (
        "rmsnorm_bf16(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ y, int n, "
        "float eps)")
    plain = GEMM.render("gemm_m64", {"T": "half", "tma": False})
    assert plain == ("gemm_m64(const half* __restrict__ A, int lda, float* out, size_t stride, unsigned epoch, "
                     "long long n)")
    tma = GEMM.render("gemm_m64", {"T": "half", "tma": True})
    assert tma.startswith(plain[:-1] + ",\n")
    lines = tma.split("\n")
    assert lines[1] == " " * len("gemm_m64(") + ("const __grid_constant__ GemmTensorMap map_a, "
                                                 "const __grid_constant__ GemmTensorMap map_w)")
    assert all(len(line) <= 120 for line in lines[:-1]) and len(lines[-1]) + len(" {") <= 120


def test_render_refuses_what_the_declaration_does_not_say():
    with pytest.raises(SignatureError, match="no value for T"):
        RMSNORM.render("rmsnorm_bf16", {})
    with pytest.raises(SignatureError, match="tma is neither"):
        RMSNORM.render("rmsnorm_bf16", {"T": "float", "tma": True})
    with pytest.raises(SignatureError, match="does not match"):
        RMSNORM.render("layernorm_bf16", {"T": "float"})
    with pytest.raises(SignatureError, match="no value for tma"):
        GEMM.render("gemm_m64", {"T": "half"})


def test_declarations_refuse_bad_parameters():
    with pytest.raises(SignatureError, match="launch option"):
        scalar("stream", "int")
    with pytest.raises(SignatureError, match="scalar type 'short'"):
        scalar("n", "short")
    with pytest.raises(SignatureError, match="not a C identifier"):
        pointer("2x", "float")
    with pytest.raises(SignatureError, match="declared twice: n"):
        KernelSignature("k", (scalar("n", "int"), scalar("n", "float")))


def test_names_match_patterns_and_one_declaration():
    assert RMSNORM.matches("rmsnorm_fp16") and not RMSNORM.matches("rmsnorm_") and not RMSNORM.matches("rmsnorm")
    assert find((RMSNORM, GEMM), "gemm_m128") is GEMM and find((RMSNORM, GEMM), "argmax") is None
    with pytest.raises(SignatureError, match="more than one"):
        find((RMSNORM, KernelSignature("rmsnorm_{x}", ())), "rmsnorm_bf16")


def test_the_source_picks_the_instance_and_must_match_one():
    source = 'extern "C" __global__ void __launch_bounds__(128) __cluster_dims__(2, 1, 1)\n' + \
        GEMM.render("gemm_m64", {"T": "half", "tma": True}) + " {\n}\n"
    params = source_parameters(source)["gemm_m64"]
    names = tuple(parameter_name(p) for p in params)
    assert names == ("A", "lda", "out", "stride", "epoch", "n", "map_a", "map_w")
    assert [p.name for p in GEMM.check_source("gemm_m64", names).params] == list(names)
    assert len(GEMM.check_source("gemm_m64", names[:6]).params) == 6
    with pytest.raises(SignatureError, match="no instance"):
        GEMM.check_source("gemm_m64", names[:5])


def _buffer(ptr=1 << 20, nbytes=64):
    return Buffer(ptr, nbytes)


def test_bind_converts_and_orders_the_arguments():
    x, w, y = _buffer(), _buffer(2 << 20), _buffer(3 << 20)
    args = bind_arguments("rmsnorm_bf16", RMSNORM, dict(eps=1e-6, n=1024, y=y, x=x, w=address(w.ptr)))
    assert args[:3] == (x, np.uint64(w.ptr), y)
    assert type(args[3]) is np.int32 and args[3] == 1024
    assert type(args[4]) is np.float32 and args[4] == np.float32(1e-6)
    gemm = dict(A=x, lda=np.int64(64), out=y, stride=1 << 40, epoch=np.uint32(7), n=-5)
    bound = bind_arguments("gemm_m64", GEMM.instance("gemm_m64", {"tma": True}),
                           dict(gemm, map_a=TensorMap(bytes(128)), map_w=ByValue(bytes(128))))
    assert [type(a) for a in bound[1:6]] == [np.int32, Buffer, np.uint64, np.uint32, np.int64]
    assert bound[3] == 1 << 40 and bound[5] == -5 and len(bound[6].raw) == 128


@pytest.mark.parametrize("change, message", [
    ({"n": None}, "no argument for n"),
    ({"count": 3}, "no parameter named count"),
    ({"n": 2.5}, "argument n (int) takes an integer, not float"),
    ({"n": _buffer()}, "argument n (int) takes an integer"),
    ({"n": 1 << 31}, "argument n (int): 2147483648 is out of its range"),
    ({"eps": "1e-6"}, "argument eps (float) takes a number"),
    ({"x": 4096}, "argument x ({T}*) takes a Buffer or an address"),
    ({"w": np.int64(4096)}, "argument w ({T}*) takes a Buffer"),
])
def test_bind_refuses_missing_extra_and_wrongly_kinded_arguments(change, message):
    values = dict(x=_buffer(), w=_buffer(), y=_buffer(), n=16, eps=1e-6)
    for name, value in change.items():
        if value is None:
            del values[name]
        else:
            values[name] = value
    with pytest.raises(DeviceError, match="launch of rmsnorm_fp16: " + re.escape(message)):
        bind_arguments("rmsnorm_fp16", RMSNORM, values)


def test_bind_checks_a_structs_kind_and_size():
    tma = GEMM.instance("gemm_m64", {"tma": True})
    values = dict(A=_buffer(), lda=1, out=_buffer(), stride=0, epoch=0, n=0, map_w=TensorMap(bytes(128)))
    with pytest.raises(DeviceError, match="argument map_a \\(GemmTensorMap by value\\) takes a ByValue"):
        bind_arguments("gemm_m64", tma, dict(values, map_a=_buffer()))
    with pytest.raises(DeviceError, match="argument map_a \\(GemmTensorMap\\) is 128 bytes, given 64"):
        bind_arguments("gemm_m64", tma, dict(values, map_a=ByValue(bytes(64))))


def test_every_declared_kernel_matches_its_cubin():
    """Every family declares every kernel of its module for sm_90 (and its quantised variant), at each shape
    ``lucegen build`` renders it for, and each declaration agrees with the compiled kernel's parameter table (count
    and sizes), read by the host-only device."""
    from lucegen import codegen
    from lucegen.compile.elf import cubin_parameters
    from lucegen.runtime.host_device import HostDevice
    from lucegen.target import load_target

    for target in (load_target("sm_90"), load_target("sm_90").quantised_target()):
        dev = HostDevice(target)
        assert not [f.name for f in codegen.families(target) if not f.signatures]
        for fam, shape in ((f, s) for f in codegen.families(target) for s in codegen.shapes(target, f)):
            compiled = codegen.build(target, fam, shape)
            table = cubin_parameters(compiled.binary)
            module = dev.load(compiled)
            for info in compiled.kernels:
                fn = module.function(info.name)
                assert fn.signature is not None, (fam.name, info.name)
                assert [p.size for p in fn.signature.params] == list(table[info.name]), (fam.name, info.name)


def test_host_device_launches_by_name():
    from lucegen import codegen
    from lucegen.runtime.host_device import HostDevice
    from lucegen.target import load_target

    dev = HostDevice(load_target("sm_90"))
    fn = dev.load(codegen.build(dev.target, "small_kernels")).function("argmax_f32")
    x, out = dev.alloc(4096), dev.alloc(4)
    fn.launch(1, 256, x=x, n=1024, out=out)
    name, *_, args = dev.launches[-1]
    assert name == "argmax_f32" and args == (x, np.int32(1024), out) and type(args[1]) is np.int32
    with pytest.raises(DeviceError, match=r"launch of argmax_f32: name its arguments \(x, n, out\)"):
        fn.launch(1, 256, (x, np.int32(1024), out))
    with pytest.raises(DeviceError, match="launch of argmax_f32: no argument for out"):
        fn.launch(1, 256, x=x, n=1024)
    with pytest.raises(DeviceError, match=r"launch of argmax_f32: argument n \(int\) takes an integer"):
        fn.launch(1, 256, x=x, n=out, out=out)
    freed = address(out.ptr)
    out.free()
    with pytest.raises(DeviceError, match="argument out .* is in no live allocation"):
        fn.launch(1, 256, x=x, n=1024, out=freed)


def test_host_device_refuses_a_declaration_the_kernel_does_not_have(monkeypatch):
    """A declaration whose parameter differs from the compiled kernel's (here n as a 64-bit integer), or whose names
    are not the source's, is refused when the function is looked up."""
    from lucegen import codegen
    from lucegen.runtime.host_device import HostDevice
    from lucegen.target import load_target

    dev = HostDevice(load_target("sm_90"))
    compiled = codegen.build(dev.target, "small_kernels")
    wide = KernelSignature("argmax_f32", (pointer("x", "float", const=True), scalar("n", "long long"),
                                          pointer("out", "int")))
    monkeypatch.setattr(codegen, "signature", lambda family, kernel: wide)
    with pytest.raises(DeviceError, match="argmax_f32: parameter n is declared int64 of 8 bytes; the source declares "
                                          "int32 and the compiled kernel takes 4 bytes"):
        dev.load(compiled).function("argmax_f32")
    renamed = KernelSignature("argmax_f32", (pointer("x", "float", const=True), scalar("count", "int"),
                                             pointer("out", "int")))
    monkeypatch.setattr(codegen, "signature", lambda family, kernel: renamed)
    with pytest.raises(DeviceError, match=r"the source declares the parameters \(x, n, out\)"):
        dev.load(compiled).function("argmax_f32")
