/* ferry_shard_publish_mpi: the four steps of a sharded publish with MPI
 * collectives (build/libferry_shard_mpi.a, compiled with mpicc; not in
 * libferry).  Every rank takes part in every collective whatever its own
 * status, so a failure anywhere ends the call on every rank with the same
 * status and never leaves a rank waiting. */
#define FERRY_SHARD_MPI 1
#include "shard_impl.h"

#include <stdlib.h>

/* the token and each record are sent with an int count */
_Static_assert(SH_MANIFEST_MAX <= INT32_MAX, "SH_MANIFEST_MAX fits an MPI count");

static int mpi_fail(int rc, const char *what)
{
    return ferry__fail(FERRY_ERR_ARG, "ferry_shard_publish_mpi: %s failed (MPI error %d)", what, rc);
}

/* Rank 0's status (and its message) to everyone. */
static int bcast_status(MPI_Comm comm, int rank, int st)
{
    struct {
        int code;
        char msg[512];
    } s = {st, ""};
    if (!rank && st) snprintf(s.msg, sizeof s.msg, "%s", ferry_last_error());
    int e = MPI_Bcast(&s, (int)sizeof s, MPI_BYTE, 0, comm);
    if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Bcast");
    if (s.code && rank) return ferry__fail(s.code, "rank 0: %s", s.msg);
    return s.code;
}

int ferry_shard_publish_mpi(ferry_shard_publisher *p, MPI_Comm comm, const ferry_shard_part *parts, size_t nparts, unsigned flags,
                            ferry_shard_publish_info *info)
{
    if (!p) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_publish_mpi: NULL publisher");
    int rank = 0, size = 0, e;
    if ((e = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS || (e = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return mpi_fail(e, "MPI_Comm_rank/size");
    uint32_t hr, hw;
    ferry__shard_pub_rank_world(p, &hr, &hw);
    int st = (uint32_t)rank == hr && (uint32_t)size == hw
                 ? FERRY_OK
                 : ferry__fail(FERRY_ERR_SHARD_WORLD, "ferry_shard_publish_mpi: the handle is rank %u of %u, the communicator says %d of %d",
                               hr, hw, rank, size);
    /* 1. the token */
    char *tok = NULL, *rec = NULL, *all = NULL;
    size_t tn = 0, rn = 0;
    int *codes = NULL, *lens = NULL, *displs = NULL;
    int local = st;
    /* rank 0's arrays of step 2, allocated now: a failure here reaches
     * every rank with the status below, before any collective needs them */
    if (!rank && !st && (!(codes = ferry__calloc(2 * (size_t)size, sizeof *codes)) || !(lens = ferry__calloc((size_t)size, sizeof *lens)) ||
                         !(displs = ferry__calloc((size_t)size, sizeof *displs))))
        st = FERRY_ERR_NOMEM;
    if (!rank && !st) st = ferry_shard_begin(p, flags, &tok, &tn);
    int any = 0;
    if ((e = MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, comm)) != MPI_SUCCESS) return mpi_fail(e, "MPI_Allreduce");
    if (any && !st) st = ferry__fail(FERRY_ERR_SHARD_WORLD, "ferry_shard_publish_mpi: a rank's handle does not match the communicator");
    if ((st = bcast_status(comm, rank, st))) goto out;
    unsigned long long len = tn;
    if ((e = MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, 0, comm)) != MPI_SUCCESS) {
        st = mpi_fail(e, "MPI_Bcast");
        goto out;
    }
    if (len > SH_MANIFEST_MAX) {
        st = ferry__fail(FERRY_ERR_LIMIT, "ferry_shard_publish_mpi: token of %llu bytes", len);
        goto out;
    }
    /* a rank that cannot hold the token says so before the broadcast, so
       that no rank is left waiting in it */
    int nomem = rank && !(tok = ferry__malloc((size_t)len + 1)), anynomem = 0;
    if ((e = MPI_Allreduce(&nomem, &anynomem, 1, MPI_INT, MPI_MAX, comm)) != MPI_SUCCESS) {
        st = mpi_fail(e, "MPI_Allreduce");
        goto out;
    }
    if (anynomem) {
        st = nomem ? FERRY_ERR_NOMEM
                   : ferry__fail(FERRY_ERR_NOMEM, "ferry_shard_publish_mpi: a rank cannot allocate the token (%llu bytes)", len);
        goto out;
    }
    if ((e = MPI_Bcast(tok, (int)len, MPI_CHAR, 0, comm)) != MPI_SUCCESS) {
        st = mpi_fail(e, "MPI_Bcast");
        goto out;
    }
    tok[len] = 0;
    tn = (size_t)len;
    /* 2. every rank's parts; statuses and records to rank 0 */
    st = ferry_shard_put(p, tok, tn, parts, nparts, &rec, &rn);
    if (!st && rn > (size_t)1 << 30) st = ferry__fail(FERRY_ERR_LIMIT, "rank %d: part record of %zu bytes", rank, rn);
    int mine[2] = {st, st ? 0 : (int)rn};
    if ((e = MPI_Gather(mine, 2, MPI_INT, codes, 2, MPI_INT, 0, comm)) != MPI_SUCCESS) {
        st = mpi_fail(e, "MPI_Gather");
        goto out;
    }
    /* rank 0 takes the records only if it can hold them all, and says so
       first: the gather happens on every rank or on none */
    long long total = 0;
    int gst = FERRY_OK;
    if (!rank) {
        for (int r = 0; r < size; r++) {
            lens[r] = codes[2 * r + 1];
            displs[r] = (int)total;
            total += lens[r];
        }
        if (total > INT32_MAX)
            gst = ferry__fail(FERRY_ERR_LIMIT, "ferry_shard_publish_mpi: the part records of %d ranks total %lld bytes (limit 2 GiB)",
                              size, total);
        else if (!(all = ferry__malloc((size_t)total + 1)))
            gst = FERRY_ERR_NOMEM;
    }
    if ((e = MPI_Bcast(&gst, 1, MPI_INT, 0, comm)) != MPI_SUCCESS) {
        st = mpi_fail(e, "MPI_Bcast");
        goto out;
    }
    if (!gst && (e = MPI_Gatherv(rec, mine[1], MPI_CHAR, all, lens, displs, MPI_CHAR, 0, comm)) != MPI_SUCCESS) {
        st = mpi_fail(e, "MPI_Gatherv");
        goto out;
    }
    /* 3. the commit */
    if (!rank) {
        int failed = -1;
        for (int r = 0; r < size && failed < 0; r++)
            if (codes[2 * r]) failed = r;
        if (failed > 0)
            st = ferry__fail(codes[2 * failed], "rank %d failed to put its parts (%s): version not committed", failed,
                             ferry_strerror(codes[2 * failed]));
        else if (!st && gst)
            st = gst; /* its message was recorded above */
        else if (!st) {
            const char **recs = ferry__calloc((size_t)size, sizeof *recs);
            size_t *sizes = ferry__calloc((size_t)size, sizeof *sizes);
            if (!recs || !sizes) st = FERRY_ERR_NOMEM;
            for (int r = 0; !st && r < size; r++) {
                recs[r] = all + displs[r];
                sizes[r] = (size_t)lens[r];
            }
            if (!st) st = ferry_shard_commit(p, tok, tn, recs, sizes, (size_t)size, info);
            free(recs);
            free(sizes);
        }
    }
    int own = st;
    st = bcast_status(comm, rank, st);
    if (rank && own && !st) st = own; /* this rank's own failure stays its message */
    if (info && (e = MPI_Bcast(info, (int)sizeof *info, MPI_BYTE, 0, comm)) != MPI_SUCCESS && !st) st = mpi_fail(e, "MPI_Bcast");
    /* 4. every rank takes the version as its base, or drops it */
    {
        int f = ferry_shard_finish(p, st == 0);
        if (!st) st = f;
    }
out:
    ferry_free(tok);
    ferry_free(rec);
    free(all);
    free(codes);
    free(lens);
    free(displs);
    return st;
}
