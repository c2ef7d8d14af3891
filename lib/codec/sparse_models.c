/* Context-model storage for the sparse codec (shared by both directions). */
#include <stdlib.h>
#include "sparse.h"

int sp_models_alloc(sp_models *m, const sp_dtype *t)
{
    memset(m, 0, sizeof *m);
    m->nclass = t->cls_mask + 1;
    m->gap = ferry__malloc(m->nclass * sizeof *m->gap);
    m->dctx = ferry__malloc(m->nclass * sizeof *m->dctx);
    if (!m->gap || !m->dctx) {
        sp_models_release(m);
        return FERRY_ERR_NOMEM;
    }
    return FERRY_OK;
}

/* Called at the start of every chunk.  Gap models are initialised when
 * their class turns out to be active (sp_num_init), which keeps small
 * chunks of wide-exponent dtypes cheap. */
void sp_models_reset(sp_models *m)
{
    sp_num_init(&m->meta);
    sp_num_init(&m->esc);
    rc_probs_init(&m->dctx[0].sign[0], m->nclass * sizeof *m->dctx / sizeof(rc_prob));
}

void sp_models_release(sp_models *m)
{
    free(m->gap);
    free(m->dctx);
    m->gap = NULL;
    m->dctx = NULL;
}

void sp_scratch_release(sp_scratch *s)
{
    free(s->pos);
    free(s->loc);
    free(s->cls);
    free(s->order);
    free(s->cnt);
    free(s->start);
    memset(s, 0, sizeof *s);
}

void sp_dscratch_release(sp_dscratch *s)
{
    free(s->pos);
    free(s->loc);
    free(s->val);
    free(s->ptr);
    free(s->end);
    free(s->cnt);
    free(s->act);
    memset(s, 0, sizeof *s);
}
