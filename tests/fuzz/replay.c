/* Corpus replay without libFuzzer: feeds every file named on the command
 * line (directories: every regular file in them, in name order) to
 * LLVMFuzzerTestOneInput, each in a buffer of exactly its size so that
 * ASan builds catch reads past the end.  Prints "N passed, M failed"
 * (M counts files that could not be read; a crash fails the whole run). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint8_t *buf = NULL;
    size_t size = 0, cap = 0;
    for (;;) {
        if (size == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); return -1; }
            buf = nb;
        }
        size_t got = fread(buf + size, 1, cap - size, f);
        size += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    uint8_t *exact = bad ? NULL : malloc(size ? size : 1);
    if (exact) {
        if (size) memcpy(exact, buf, size);
        LLVMFuzzerTestOneInput(exact, size);
    }
    free(exact);
    free(buf);
    return exact ? 0 : -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Replays a directory's regular files in name order; counts into *ok / *bad. */
static void replay_dir(const char *dir, int *ok, int *bad)
{
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "%s: cannot list\n", dir); (*bad)++; return; }
    char **names = NULL;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        if (!nn || !(nn[n] = strdup(de->d_name))) { names = nn ? nn : names; (*bad)++; break; }
        names = nn;
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (replay_file(path)) { fprintf(stderr, "%s: cannot read\n", path); (*bad)++; }
            else (*ok)++;
        }
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    int ok = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) replay_dir(argv[i], &ok, &bad);
        else if (replay_file(argv[i])) { fprintf(stderr, "%s: cannot read\n", argv[i]); bad++; }
        else ok++;
    }
    printf("%d passed, %d failed\n", ok, bad);
    return bad != 0;
}
