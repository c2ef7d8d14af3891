/* Internal interface of lib/io (safetensors single files and sharded
 * checkpoints).  The public entry points are ferry_model_open and
 * ferry_model_save in ferry.h; these are the pieces they are built from,
 * shared with the tests and the fuzz target. */
#ifndef FERRY_IO_H
#define FERRY_IO_H
#include "model.h"

#include <jansson.h>

/* Upper bound on the JSON header of a .safetensors file, and on a sharded
 * index file: the reference implementation's MAX_HEADER_SIZE. */
#define FERRY__ST_MAX_HEADER 100000000u

/* Parses a whole .safetensors image held in memory.  The model borrows buf
 * (read-only): buf must outlive *out.  label names the input in error
 * messages (a file path, or "fuzz").  Nothing is read outside
 * buf[0..size); on failure *out is NULL and the FERRY_ERR_ST_* code and
 * message name the label, the tensor and the field.  buf may be NULL when
 * size is 0. */
int ferry__st_parse_buffer(const uint8_t *buf, size_t size, const char *label, ferry_model **out);

/* One .safetensors file, mapped read-only; the mapping is released with the
 * model.  A missing file is FERRY_ERR_NOT_FOUND. */
int ferry__st_open_file(const char *path, ferry_model **out);

/* A sharded checkpoint described by a model.safetensors.index.json file
 * (st_index.c). */
int ferry__st_open_index(const char *index_path, ferry_model **out);

/* The header ferry_model_save writes for m (JSON, space-padded to a
 * multiple of 8 bytes, without the u64 length in front), in a new buffer
 * of *len bytes released with free().  The file is then u64 *len, the
 * header, and every tensor's bytes in name order. */
int ferry__st_header(const ferry_model *m, char **out, size_t *len);

/* Moves every mapping of src to dst, all or nothing: afterwards dst unmaps
 * them and src only forgets them (src's tensors still point into them, so
 * src must be freed before dst). */
int ferry__model_adopt_mappings(ferry_model *dst, ferry_model *src);

/* Status and message for a failed json_loadb: code, except that a repeated
 * key is FERRY_ERR_ST_DUPLICATE and an allocation failure FERRY_ERR_NOMEM. */
int ferry__json_load_fail(const json_error_t *err, int code, const char *label, const char *what);

/* "dir/name" into out (cap bytes); FERRY_ERR_ARG if it does not fit. */
int ferry__path_join(char *out, size_t cap, const char *dir, const char *name);

#endif
