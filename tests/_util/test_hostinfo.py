"""Specification of `tfrs_logq._util.hostinfo`: the machine a measurement ran on."""

from tfrs_logq._util import hostinfo

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw

processor\t: 1
model name\t: another name, never read
"""


def test_family_model_and_the_widest_vector_extension(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(ZEN4)
    assert hostinfo.cpu_name(str(path)) == "AMD EPYC"
    assert hostinfo.cpu_description(str(path)) == "AMD EPYC (family 25, model 17), AVX-512"
    path.write_text(ZEN4.replace(" avx512f avx512bw", ""))
    assert hostinfo.cpu_description(str(path)) == "AMD EPYC (family 25, model 17), AVX2"


def test_without_cpuinfo_it_still_names_something(tmp_path):
    description = hostinfo.cpu_description(str(tmp_path / "absent"))
    assert description and "family" not in description
    assert hostinfo.machine_description().endswith(hostinfo.cpu_description())


def test_available_memory_is_meminfos_memavailable_else_the_physical_memory(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\n"
                    "MemAvailable:   20000000 kB\n")
    assert hostinfo.available_memory_bytes(str(path)) == 20_000_000 * 1024
    physical = hostinfo.available_memory_bytes(str(tmp_path / "absent"))
    assert physical > 20_000_000 * 1024 or physical > 0
