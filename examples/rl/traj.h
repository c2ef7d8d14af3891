/*
 * traj.h — trajectory batches and their wire format.
 *
 * A batch is what one rollout call produces: n_prompts prompts, group
 * completions of each, their rewards, and the policy version that sampled
 * them.  Islands serialize batches into a store; the trainer parses them
 * back.  The dock (lib/dock) wraps them with run id, island id, sequence
 * number and its own checksum; this format is only the payload, but it is
 * parsed as hostile input all the same: every count is bounded, every
 * length overflow-checked, every token range-checked, the whole buffer
 * checksummed, and nothing is allocated before the declared sizes are
 * proven to match the buffer.
 *
 * Wire format v1 (all integers little-endian):
 *     0   4   magic "FRLB"
 *     4   4   u32 format (1)
 *     8   8   u64 version        policy version that sampled the batch
 *    16   8   u64 seed           ┐ the PRNG coordinates: completion j of
 *    24   8   u64 step           │ prompt i was drawn from the stream
 *    32   4   u32 first_prompt   ┘ (seed, SAMPLE, step, first_prompt+i, j)
 *    36   4   u32 n_prompts      1..RL_BATCH_MAX_PROMPTS
 *    40   4   u32 group          1..RL_BATCH_MAX_GROUP
 *    44   4   u32 prompt_len     1..RL_TASK_MAX_LEN
 *    48   4   u32 completion_len 1..RL_TASK_MAX_LEN
 *    52   4   u32 vocab          2..256; every token is < vocab
 *    56       prompts            n_prompts × prompt_len bytes
 *             completions        n_prompts × group × completion_len bytes
 *             rewards            n_prompts × group × f32 (finite)
 *      end-8  u64 checksum       FNV-1a 64 of every byte before it
 * n_prompts × group is at most RL_BATCH_MAX_COMPLETIONS.
 */
#ifndef RL_TRAJ_H
#define RL_TRAJ_H

#include <stddef.h>
#include <stdint.h>

#include "task.h"

#define RL_BATCH_FORMAT 1u
#define RL_BATCH_HEADER 56u
#define RL_BATCH_MAX_PROMPTS 65536u
#define RL_BATCH_MAX_GROUP 1024u
#define RL_BATCH_MAX_COMPLETIONS 1048576u

/* Errors of the parser, beyond ferry's FERRY_ERR_ARG / FERRY_ERR_NOMEM /
 * FERRY_ERR_LIMIT.  Numbered apart from the library's ranges. */
enum {
    RL_ERR_BATCH_MAGIC = 200,     /* not a trajectory batch, or unknown format */
    RL_ERR_BATCH_TRUNCATED = 201, /* shorter than its header says */
    RL_ERR_BATCH_CORRUPT = 202,   /* a field out of range, or bytes left over */
    RL_ERR_BATCH_CHECKSUM = 203,  /* the checksum does not match */
    RL_ERR_BATCH_REWARD = 204,    /* a reward differs from the task's */
};

typedef struct rl_batch {
    uint64_t version;
    uint64_t seed, step;
    uint32_t first_prompt, n_prompts, group, prompt_len, completion_len, vocab;
    uint8_t *prompts;     /* [n_prompts][prompt_len] */
    uint8_t *completions; /* [n_prompts][group][completion_len] */
    float *rewards;       /* [n_prompts][group] */
} rl_batch;

/* Allocates the arrays of a batch with these dimensions (zeroed) and sets
 * them; other fields are zeroed.  FERRY_ERR_LIMIT past the bounds above. */
int rl_batch_alloc(rl_batch *b, uint32_t n_prompts, uint32_t group, uint32_t prompt_len,
                   uint32_t completion_len, uint32_t vocab);
/* Frees the arrays; b may be zeroed or NULL. */
void rl_batch_release(rl_batch *b);

/* Bytes of b's wire form; 0 if b breaks a bound. */
size_t rl_batch_wire_size(const rl_batch *b);

/* Writes b into buf (cap bytes, at least rl_batch_wire_size).  Validates b
 * as the parser would (FERRY_ERR_ARG otherwise): a batch that serializes
 * always parses. */
int rl_batch_serialize(const rl_batch *b, void *buf, size_t cap, size_t *written);

/* Parses size bytes into *out (allocated; rl_batch_release it).  On error
 * *out is zeroed and, if err is not NULL, err gets a one-line reason
 * naming the field.  Returns RL_ERR_BATCH_*, FERRY_ERR_LIMIT or
 * FERRY_ERR_NOMEM. */
int rl_batch_parse(const void *buf, size_t size, rl_batch *out, char *err, size_t errlen);

/* Recomputes every reward with the task (the reward is verifiable, so a
 * trainer need not trust an island's numbers): RL_ERR_BATCH_REWARD if one
 * differs, FERRY_ERR_ARG if the batch's lengths are not the task's. */
int rl_batch_verify_rewards(const rl_batch *b, const rl_task *t);

/* Mean reward of the batch. */
double rl_batch_mean_reward(const rl_batch *b);

/* Short static name of an RL_ERR_BATCH_* code, else ferry_strerror's. */
const char *rl_strerror(int code);

#endif /* RL_TRAJ_H */
