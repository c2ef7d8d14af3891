# Open MPI for the test scripts (sourced after sync_env.sh, which sets
# WORK): ranks talk over loopback only, may oversubscribe the 2 cores and
# run as root.  Under SAN=1 the leak checker is told that Open MPI's own
# allocations are not ours: put "${MPIENV[@]}" between mpirun's options and
# the program.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1
MPIENV=()
if [ "${SAN:-}" = 1 ]; then
    printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so libpmix.so libhwloc.so libevent \
        '<unknown module>' >"$WORK/lsan.supp"
    MPIENV=(env ASAN_OPTIONS=fast_unwind_on_malloc=0 LSAN_OPTIONS=suppressions=$WORK/lsan.supp)
fi
