"""engine/native/cpu.py: the doctor's line about the CPU's units wider than AVX-512F."""

from engine.native import cpu


def test_present_units_are_named_and_said_to_be_unused():
    line = cpu.wider_units({"avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"}, amx=True)
    assert line.startswith("avx512_vnni, avx512_bf16, amx_tile: unused")
    assert "refused" not in line


def test_amx_the_os_refuses_is_said_to_be_refused():
    assert "amx_tile (refused by the OS)" in cpu.wider_units({"amx_tile"}, amx=False)


def test_none_present():
    assert cpu.wider_units({"avx2", "fma"}) == "none beyond AVX-512F / AVX2"


def test_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu.cpu_flags(info) == {"fpu", "avx2", "avx512_vnni"}
    assert cpu.cpu_flags(tmp_path / "missing") == set()
