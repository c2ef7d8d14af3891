/* ferry-shard-mpi: publish checkpoints as sharded versions from R ranks
 * under MPI (`mpirun -np R ferry-shard-mpi STORE --run RUN FILE...`).
 *
 * Each rank maps the checkpoint and owns rows [r*rows/R, (r+1)*rows/R) of
 * every tensor: it reads (touches) only those rows, diffs them against its
 * own previous tiles and uploads one object; rank 0 commits.  This is the
 * CLI face of ferry_shard_publish_mpi; a trainer calls that (or the three
 * steps with its own collectives) with the shards it already holds. */
#define FERRY_SHARD_MPI 1
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_sync.h"
#include "ferry_quant.h"
#include "ferry_shard.h"
#include "util.h"

static void help(void)
{
    printf("usage: mpirun -np R ferry-shard-mpi STORE --run RUN [--cast-bf16] [--tile-words N]\n"
           "                  [--anchor-every K] [--threads N] [--quantize fp8-block128]\n"
           "                  [--sign-key PATH] [--json] FILE...\n\n"
           "Publishes each FILE (a .safetensors checkpoint) as the next version of the\n"
           "sharded run RUN, from R ranks: rank r owns rows [r*rows/R, (r+1)*rows/R) of\n"
           "every tensor (dim 0; 1-D tensors by element), diffs and uploads only those,\n"
           "and rank 0 commits the version (manifest, then HEAD by compare-and-swap) once\n"
           "every rank's object is durable.  Prints one line per version (rank 0), with\n"
           "the peak RSS of every rank during that version's publish.\n\n"
           "  --cast-bf16       publish F32 tensors as their BF16 cast (FP32 masters)\n"
           "  --tile-words N    smallest block of the grid (a tensor's rows x a column\n"
           "                    block), in elements; row parts cut it, so tiles are\n"
           "                    about N / ranks (default 262144; the run's first\n"
           "                    version fixes it)\n"
           "  --anchor-every K  an anchor version every K versions (default 10)\n"
           "  --threads N       codec threads per rank (default 1)\n"
           "  --quantize S      publish the FP8 checkpoint (fp8-block128, as `ferry publish\n"
           "                    --quantize`): each rank quantizes its rows, cut on multiples\n"
           "                    of 128 (rank r owns rows from r*rows/R rounded up to 128)\n\n%s\n",
           sync_common_help);
}

/* r * rows / R, rounded up to a multiple of grid (0: none) and clamped. */
static uint64_t cut(uint64_t rows, int r, int R, uint64_t grid)
{
    uint64_t a = rows * (uint64_t)r / (uint64_t)R;
    if (grid && a % grid) a = (a / grid + 1) * grid;
    return a < rows ? a : rows;
}

/* The rows this rank owns of every tensor of m (grid: FP8 blocks whole). */
static size_t my_parts(const ferry_model *m, int r, int R, uint64_t grid, ferry_shard_part *out)
{
    size_t n = 0;
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        uint64_t rows = t->ndim ? t->shape[0] : 1, cols = t->ndim ? t->nelem / (rows ? rows : 1) : 1;
        uint64_t a = cut(rows, r, R, grid), b = cut(rows, r + 1, R, grid);
        if (a == b) continue;
        out[n++] = (ferry_shard_part){t->name, t->dtype, t->ndim, t->shape, a, b,
                                      (const uint8_t *)t->data + a * cols * (ferry_dtype_bits(t->dtype) / 8)};
    }
    return n;
}

/* Reads this rank's rows of every part from the file with pread into one
 * heap buffer (its shard) and points the parts at it; *shard: the buffer
 * (the caller frees it), or NULL when the file is not one safetensors file
 * whose tensors cover its data region from 8 + header length to its end
 * (a directory or index checkpoint): the parts then stay on the mapping.
 * A read error or a file that now ends before the rows (rewritten in
 * place since it was opened, as torch.save over it does) fails with
 * FERRY_ERR_IO, its message printed: the mapping would then fault
 * (SIGBUS) on those pages.
 * A trainer holds its shard in memory; reading the rows through the
 * mapping instead also counts in RSS file pages around them: a fault maps
 * the whole page-cache folio it hits (Linux 6.18 on ext4 maps whole large
 * folios, 2 MiB after a sequential read), so each edge of a rank's rows of
 * each tensor brought up to 2 MiB of its neighbours' rows (R = 4 on the
 * 1 GiB synthetic pair: 230-280 MiB per rank above its 258 MiB shard;
 * madvise(MADV_RANDOM) did not change it once the folios exist). */
static int read_rows(const char *path, const ferry_model *m, ferry_shard_part *parts, size_t n, uint8_t **shard)
{
    uint64_t data = 0, total = 0;
    const uint8_t *lo = NULL;
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        data += t->nbytes;
        if (!lo || (const uint8_t *)t->data < lo) lo = t->data;
    }
    uint64_t *len = calloc(n + 1, sizeof *len);
    for (size_t i = 0; len && i < n; i++) {
        uint64_t nelem = 1;
        for (uint32_t d = 0; d < parts[i].ndim; d++) nelem *= parts[i].shape[d];
        uint64_t rows = parts[i].ndim ? parts[i].shape[0] : 1;
        len[i] = (parts[i].row_end - parts[i].row_begin) * (nelem / rows) * (ferry_dtype_bits(parts[i].dtype) / 8);
        total += len[i];
    }
    int fd = len && lo ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat st;
    uint8_t head[8], *buf = NULL;
    int rc = FERRY_OK;
    /* one safetensors file: it begins with a header length of at most the
       format's 100 MB (an index's JSON text read as a number is far more) */
    if (fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode) && pread(fd, head, 8, 0) == 8) {
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++) hl |= (uint64_t)head[i] << (8 * i);
        uint64_t start = 8 + hl; /* the data region's offset in the file */
        if (hl <= 100000000u && (uint64_t)st.st_size < start + data) {
            /* shorter than when it was opened: the mapping's pages past
               its end would fault (SIGBUS) */
            fprintf(stderr, "ferry shard-mpi: %s: %llu bytes, its header and tensors need %llu (changed since it was opened?)\n",
                    path, (unsigned long long)st.st_size, (unsigned long long)(start + data));
            rc = FERRY_ERR_IO;
        } else if (hl <= 100000000u && (uint64_t)st.st_size == start + data) {
            buf = malloc(total + 1);
        }
        for (size_t i = 0, at = 0; buf && i < n; at += len[i++]) {
            uint64_t off = start + (uint64_t)((const uint8_t *)parts[i].data - lo);
            for (uint64_t got = 0; got < len[i];) {
                ssize_t k = pread(fd, buf + at + got, (size_t)(len[i] - got), (off_t)(off + got));
                if (k < 0 && errno == EINTR) continue;
                if (k <= 0) {
                    /* (printed here: the collective's failure replaces the library's last message) */
                    fprintf(stderr, "ferry shard-mpi: %s: reading tensor '%s' rows %llu..%llu at offset %llu: %s (changed since it was opened?)\n",
                            path, parts[i].name, (unsigned long long)parts[i].row_begin, (unsigned long long)parts[i].row_end,
                            (unsigned long long)(off + got), k < 0 ? strerror(errno) : "the file ends first");
                    rc = FERRY_ERR_IO;
                    free(buf);
                    buf = NULL;
                    break;
                }
                got += (uint64_t)k;
            }
        }
        for (size_t i = 0, at = 0; buf && i < n; at += len[i++]) parts[i].data = buf + at;
    }
    if (fd >= 0) close(fd);
    free(len);
    *shard = buf;
    return rc;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, R = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    const char *cmd = "shard-mpi";
    sync_common c;
    sync_common_init(&c);
    ferry_shard_options o = {.rank = (uint32_t)rank, .world = (uint32_t)R};
    char **files = calloc((size_t)argc + 1, sizeof *files);
    int nfiles = 0, ret = 0;
    for (int i = 1; i < argc && !ret; i++) {
        const char *a = argv[i];
        long v;
        if (cli_is_help(a)) {
            if (!rank) help();
            MPI_Finalize();
            return 0;
        }
        int r = sync_common_opt(cmd, argc, argv, &i, &c);
        if (r == 2) ret = 2;
        if (r) continue;
        if (!strcmp(a, "--cast-bf16")) o.cast_bf16 = 1;
        else if (!strcmp(a, "--quantize")) {
            ferry_quant q;
            if (++i == argc) ret = cli_usage_error(cmd, "--quantize needs a scheme");
            else if (ferry_quant_parse(argv[i], &q)) ret = cli_usage_error(cmd, "--quantize: %s", ferry_last_error());
            else o.quantize = (int)q;
        }
        else if (!strcmp(a, "--tile-words") || !strcmp(a, "--anchor-every") || !strcmp(a, "--threads")) {
            if (++i == argc || !cli_parse_int(argv[i], 1, 1L << 40, &v)) ret = cli_usage_error(cmd, "%s needs a positive number", a);
            else if (a[2] == 't' && a[3] == 'i') o.min_tile_words = (uint64_t)v;
            else if (a[2] == 'a') o.anchor_every = (uint32_t)v;
            else o.threads = (int)v;
        } else if (a[0] == '-' && a[1]) ret = cli_usage_error(cmd, "unknown option '%s'", a);
        else if (!sync_common_pos(&c, a)) files[nfiles++] = argv[i];
    }
    if (!ret) ret = sync_common_check(cmd, &c);
    if (!ret && !nfiles) ret = cli_usage_error(cmd, "expects at least one FILE");
    ferry_store *store = NULL;
    ferry_shard_publisher *p = NULL;
    if (!ret) ret = sync_open_store(cmd, &c, 1, &store);
    if (!ret) {
        o.keys = c.keys; /* --sign-key: rank 0 signs the manifest and HEAD */
        int rc = ferry_shard_publisher_open(store, c.run, &o, &p);
        if (rc) ret = sync_fail(cmd, rc, c.run);
    }
#ifdef FERRY_TEST_HOOKS
    /* build/tests/ferry-shard-mpi-hooks only: tests/scripts/shard_mpi.sh
     * kills a rank by its pid */
    const char *piddir = getenv("FERRY_SHARD_TEST_PIDDIR");
    if (!ret && piddir) {
        char path[4096], pid[32];
        snprintf(path, sizeof path, "%s/rank-%d.pid", piddir, rank);
        snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        ferry_file_write(path, pid, strlen(pid));
    }
#endif
    for (int f = 0; f < nfiles && !ret; f++) {
        /* peak RSS per version: Linux resets VmHWM on "5" to clear_refs */
        FILE *cr = fopen("/proc/self/clear_refs", "w");
        if (cr) {
            fputs("5", cr);
            fclose(cr);
        }
        ferry_model *m = NULL;
        int rc = ferry_model_open(files[f], &m);
        size_t n = 0;
        ferry_shard_part *parts = NULL;
        if (!rc && !(parts = calloc(ferry_model_count(m) + 1, sizeof *parts))) rc = FERRY_ERR_NOMEM;
        if (!rc) n = my_parts(m, rank, R, o.quantize ? FERRY_QUANT_BLOCK : 0, parts);
#ifdef FERRY_TEST_HOOKS
        /* build/tests/ferry-shard-mpi-hooks only: FERRY_SHARD_TEST_TRUNCATE=N
         * truncates the checkpoint to N bytes once opened (a file rewritten
         * in place), for tests/scripts/shard_mpi_rows.sh */
        if (!rc && getenv("FERRY_SHARD_TEST_TRUNCATE") && truncate(files[f], (off_t)atoll(getenv("FERRY_SHARD_TEST_TRUNCATE"))))
            perror(files[f]);
#endif
        uint8_t *shard = NULL;
        if (!rc) rc = read_rows(files[f], m, parts, n, &shard);
        /* a rank that cannot read its file still joins the collective, with
         * no parts: the commit then fails with a gap, on every rank */
        int own = rc;
        double t0 = cli_now();
        ferry_shard_publish_info info;
        rc = ferry_shard_publish_mpi(p, MPI_COMM_WORLD, parts, own ? 0 : n, 0, &info);
        double secs = cli_now() - t0;
        if (own) rc = own;
        long rss = cli_peak_rss_kib(), *all = rank ? NULL : calloc((size_t)R, sizeof *all);
        MPI_Gather(&rss, 1, MPI_LONG, all, 1, MPI_LONG, 0, MPI_COMM_WORLD);
        if (rc) ret = sync_fail(cmd, rc, own ? files[f] : c.run);
        else if (!rank && c.json) {
            printf("{\"file\": ");
            json_str(stdout, files[f]);
            printf(", \"version\": %llu, \"kind\": \"%s\", \"world\": %u, \"parts\": %llu, \"tiles\": %llu, \"delta_bytes\": %llu, "
                   "\"anchor_bytes\": %llu, \"manifest_bytes\": %llu, \"model_bytes\": %llu, \"seconds\": %.3f, \"peak_rss_kib\": [",
                   (unsigned long long)info.version, info.kind == FERRY_SYNC_ANCHOR ? "anchor" : "delta", info.world,
                   (unsigned long long)info.parts, (unsigned long long)info.tiles, (unsigned long long)info.delta_bytes,
                   (unsigned long long)info.anchor_bytes, (unsigned long long)info.manifest_bytes,
                   (unsigned long long)info.model_bytes, secs);
            for (int r = 0; r < R; r++) printf("%s%ld", r ? ", " : "", all[r]);
            printf("]}\n");
        } else if (!rank && !c.quiet) {
            printf("%s: version %llu (%s) from %u ranks: %llu tiles, delta %llu B, anchor %llu B, manifest %llu B, %.2f s\n",
                   files[f], (unsigned long long)info.version, info.kind == FERRY_SYNC_ANCHOR ? "anchor" : "delta", info.world,
                   (unsigned long long)info.tiles, (unsigned long long)info.delta_bytes, (unsigned long long)info.anchor_bytes,
                   (unsigned long long)info.manifest_bytes, secs);
        }
        fflush(stdout);
        free(all);
        free(parts);
        free(shard);
        ferry_model_free(m);
    }
    ferry_shard_publisher_free(p);
    ferry_store_free(store);
    free(files);
    MPI_Finalize();
    return ret;
}
