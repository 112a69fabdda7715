import sys, re
sys.path.insert(0, ".")
from kiln.codegen.cpp_gemm import gemm_source, GemmSchedule
src = gemm_source(GemmSchedule())
nopf = src.replace("if (next_b) micro_t<true>", "if (false) micro_t<true>")
assert nopf != src
def ns(s, name): return s.replace('extern "C" ', "").replace("kiln_gemm(", f"{name}(").replace("kiln_pack_b(", f"{name}_pack_b(").replace("kiln_gemm_mr", f"{name}_mr").replace("kiln_gemm_nr", f"{name}_nr")
main = open("scratch_s7/pf_main.cpp").read()
body = "namespace A {\n" + ns(src, "gemm_pf") + "\n}\nnamespace B {\n" + ns(nopf, "gemm_nopf") + "\n}\n" + main
incs = sorted(set(re.findall(r"#include <[^>]+>\n", body))); body = "".join(incs) + re.sub(r"#include <[^>]+>\n", "", body)
open("/tmp/pf2.cpp", "w").write("#include <chrono>\n#include <cstdio>\n#include <vector>\n#include <algorithm>\n" + body)
