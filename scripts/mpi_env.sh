# Sourced by scripts/*.sh, bench/*.sh and tests/e2e/lib.sh: single-host Open MPI jobs talk over shared memory
# only, so no rank opens a TCP port (Open MPI's default TCP transport listens on every interface).
#   pml ob1, btl self,vader     messages between ranks: in-process and shared memory (no btl tcp, no UCX)
#   oob_tcp_if_include lo       mpirun's own out-of-band channel advertises and uses only the loopback interface
# What remains (Open MPI 4.1, measured with `ss -ltnp` during a run, docs/SECURITY.md): mpirun itself still holds
# a listening socket of its out-of-band (ORTE) channel bound to the wildcard address, IPv4 and IPv6; the ranks
# hold none. A value the user already set wins. Multi-host runs: see README ("Network exposure").
# MPICH ignores these variables.
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_oob_tcp_if_include="${OMPI_MCA_oob_tcp_if_include:-lo}"

# Real-data numerics, one BLAS kernel on every x86-64 host: OpenBLAS picks its GEMM kernels by CPU, and with its FMA
# kernels (Haswell, Zen, SkylakeX) a row's result depends on how many rows the GEMM has (OpenBLAS 0.3.21, measured:
# row 0 of a 16 x 32 product differs in 11 of 32 columns between M = 1..8 and M >= 13 rows). A sharded run's GEMMs have
# fewer rows than its single-device reference's, so they round differently, and a capacity-dropping MoE under a
# sequence split can order near-tied tokens otherwise (validation FAIL by about 1e-3; 2e-8 without FMA; the router's
# own logits are row-count independent, kernels::router_logits, but the rows it reads are not). With Sandybridge's
# AVX kernels (no FMA; every x86-64 CPU since 2011) every row has the same bits for any M, so a sharded run rounds as
# its reference does. A value the user set wins.
case "$(uname -m)" in x86_64 | amd64) export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Sandybridge}" ;; esac
