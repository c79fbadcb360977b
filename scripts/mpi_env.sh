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
