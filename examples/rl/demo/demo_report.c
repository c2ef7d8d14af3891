/* ferry-demo: the HTML report — one self-contained file (inline CSS and
 * SVG, no script, no external asset) that any browser opens offline:
 *   - mean reward per step (every leg; kills and restarts marked);
 *   - bytes per version: a full BF16 checkpoint against the ferry delta;
 *   - cumulative bytes uploaded against shipping full checkpoints;
 *   - BF16 words changed per step;
 *   - the staleness histogram of consumed batches;
 *   - with adaptive publication, the legs side by side (bytes, reward);
 *   - with FP8 rollouts, bytes per version (the FP8 patch against the BF16
 *     patch of the same step, and the checkpoints) and reward, BF16 and FP8
 *     legs side by side. */
#include "demo.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define W 640
#define H 280
#define ML 70 /* margins */
#define MR 20
#define MT 46
#define MB 42

static const char *const k_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};

enum { FMT_PLAIN, FMT_BYTES, FMT_PCT };

typedef struct series {
    const char *name;
    const char *color;
    double *x, *y;
    size_t n;
    int dashed;
} series;

static void esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

static void fmt_val(char *buf, size_t cap, double v, int fmt)
{
    if (fmt == FMT_BYTES) {
        if (v >= 1e6) snprintf(buf, cap, "%.3g MB", v / 1e6);
        else if (v >= 1e3) snprintf(buf, cap, "%.3g kB", v / 1e3);
        else snprintf(buf, cap, "%.0f B", v);
    } else if (fmt == FMT_PCT) {
        snprintf(buf, cap, "%.3g%%", v);
    } else {
        snprintf(buf, cap, "%.3g", v);
    }
}

/* A "nice" step (1, 2, 5 x 10^k) giving about n ticks over span. */
static double nice_step(double span, int n)
{
    if (span <= 0) return 1;
    double raw = span / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* Title, grid, ticks (x ticks on integers: steps, versions, categories). */
static void axes(FILE *f, const char *title, const char *xlabel, double x0, double x1, double y1, int yfmt, double *sx, double *sy)
{
    double pw = W - ML - MR, ph = H - MT - MB;
    *sx = x1 > x0 ? pw / (x1 - x0) : 1;
    *sy = y1 > 0 ? ph / y1 : 1;
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">\n", W, H, W, H);
    fprintf(f, "<text x=\"%d\" y=\"18\" class=\"t\">", ML);
    esc(f, title);
    fprintf(f, "</text>\n");
    double ys = nice_step(y1, 5);
    for (double y = 0; y <= y1 * 1.0001; y += ys) {
        double py = MT + ph - y * *sy;
        char lab[32];
        fmt_val(lab, sizeof lab, y, yfmt);
        fprintf(f, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"g\"/><text x=\"%d\" y=\"%.1f\" class=\"yl\">%s</text>\n",
                ML, ML + pw, py, py, ML - 6, py + 4, lab);
    }
    double xs = nice_step(x1 - x0, 8);
    if (xs < 1) xs = 1;
    for (double x = ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs) {
        double px = ML + (x - x0) * *sx, lx = x == 0 ? 0 : x; /* no "-0" */
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%.1f\" class=\"a\"/><text x=\"%.1f\" y=\"%.1f\" class=\"xl\">%g</text>\n",
                px, px, MT + (int)ph, MT + ph + 5, px, MT + ph + 18, lx);
    }
    fprintf(f, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"a\"/>", ML, ML + pw, MT + ph, MT + ph);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%.1f\" class=\"a\"/>\n", ML, ML, MT, MT + ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"xl\">", ML + pw / 2, H - 6);
    esc(f, xlabel);
    fprintf(f, "</text>\n");
}

static void legend(FILE *f, const series *s, size_t ns)
{
    double x = ML;
    for (size_t i = 0; i < ns; i++) {
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2.5\"%s/>", x, x + 18, MT - 14, MT - 14,
                s[i].color, s[i].dashed ? " stroke-dasharray=\"5,3\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"lg\">", x + 22, MT - 10);
        esc(f, s[i].name);
        fprintf(f, "</text>");
        x += 40 + 7.0 * (double)strlen(s[i].name);
    }
    fprintf(f, "\n");
}

/* Line chart; vlines (steps) drawn as dashed markers with labels. */
static void line_chart(FILE *f, const char *title, const char *xlabel, const series *s, size_t ns, int yfmt, double ymax_min,
                       const double *vx, const char *const *vlab, const char *const *vcol, size_t nv)
{
    double x0 = INFINITY, x1 = -INFINITY, y1 = ymax_min;
    for (size_t i = 0; i < ns; i++)
        for (size_t j = 0; j < s[i].n; j++) {
            if (s[i].x[j] < x0) x0 = s[i].x[j];
            if (s[i].x[j] > x1) x1 = s[i].x[j];
            if (s[i].y[j] > y1) y1 = s[i].y[j];
        }
    if (!isfinite(x0)) x0 = 0, x1 = 1;
    if (x1 <= x0) x1 = x0 + 1;
    y1 *= 1.05;
    if (y1 <= 0) y1 = 1;
    double sx, sy, ph = H - MT - MB;
    axes(f, title, xlabel, x0, x1, y1, yfmt, &sx, &sy);
    for (size_t i = 0; i < nv; i++) {
        double px = ML + (vx[i] - x0) * sx;
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%.1f\" class=\"ev\" style=\"stroke:%s\"/>"
                   "<text x=\"%.1f\" y=\"%d\" class=\"evl\" style=\"fill:%s\">",
                px, px, MT + 4, MT + ph, vcol[i], px + 3, MT + 14 + 11 * (int)(i % 4), vcol[i]);
        esc(f, vlab[i]);
        fprintf(f, "</text>\n");
    }
    for (size_t i = 0; i < ns; i++) {
        if (!s[i].n) continue;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"", s[i].color,
                s[i].dashed ? " stroke-dasharray=\"5,3\"" : "");
        for (size_t j = 0; j < s[i].n; j++)
            fprintf(f, "%.1f,%.1f ", ML + (s[i].x[j] - x0) * sx, MT + ph - s[i].y[j] * sy);
        fprintf(f, "\"/>\n");
    }
    legend(f, s, ns);
    fprintf(f, "</svg>\n");
}

/* Grouped bars: nb categories, one bar per leg. */
static void bar_chart(FILE *f, const char *title, const char *xlabel, const demo_leg *legs, size_t nlegs, size_t nb)
{
    double y1 = 1;
    for (size_t l = 0; l < nlegs; l++)
        for (size_t b = 0; b < nb; b++)
            if ((double)legs[l].stale_hist[b] > y1) y1 = (double)legs[l].stale_hist[b];
    y1 *= 1.1;
    double sx, sy, pw = W - ML - MR, ph = H - MT - MB;
    /* categories on [-0.5, nb - 0.5] */
    axes(f, title, xlabel, -0.5, (double)nb - 0.5, y1, FMT_PLAIN, &sx, &sy);
    double bw = pw / (double)nb * 0.8 / (double)nlegs;
    for (size_t l = 0; l < nlegs; l++)
        for (size_t b = 0; b < nb; b++) {
            double v = (double)legs[l].stale_hist[b];
            double px = ML + ((double)b + 0.5) * sx - 0.4 * pw / (double)nb + (double)l * bw;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>", px, MT + ph - v * sy, bw * 0.95, v * sy,
                    k_colors[l % 5]);
            if (v > 0) fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"bl\">%.0f</text>", px + bw / 2, MT + ph - v * sy - 3, v);
        }
    series s[2];
    for (size_t l = 0; l < nlegs && l < 2; l++) s[l] = (series){legs[l].name, k_colors[l % 5], NULL, NULL, 0, 0};
    legend(f, s, nlegs < 2 ? nlegs : 2);
    fprintf(f, "</svg>\n");
}

static void mbs(char *buf, size_t cap, uint64_t v) { fmt_val(buf, cap, (double)v, FMT_BYTES); }

/* FP8 rollouts: bytes per version (the FP8 leg's patch against the BF16
 * patch of the same step; the BF16 leg's patches; both checkpoints) and
 * reward per step, BF16 and FP8 legs side by side.  Returns 0 or -1 (no
 * memory). */
static int fp8_section(FILE *f, const demo_leg *legs, size_t nlegs)
{
    const demo_leg *q = NULL, *b = NULL;
    for (size_t l = 0; l < nlegs; l++) {
        if (legs[l].quant && !q) q = &legs[l];
        if (!legs[l].quant && !b) b = &legs[l];
    }
    if (!q) return 0;
    size_t n = q->nsteps + (b ? b->nsteps : 0) + 4;
    double *a = calloc(7 * n, sizeof *a);
    if (!a) return -1;
    double *vx = a, *v8 = a + n, *v16 = a + 2 * n, *bx = a + 3 * n, *bb = a + 4 * n, *lmax = a + 5 * n, *lmean = a + 6 * n;
    size_t nq = 0, nb = 0;
    for (size_t i = 0; i < q->nsteps; i++)
        if (q->steps[i].published) {
            vx[nq] = (double)q->steps[i].pub_version;
            v8[nq] = (double)q->steps[i].delta_bytes;
            lmax[nq] = q->steps[i].fp8_logit_max;
            lmean[nq] = q->steps[i].fp8_logit_mean;
            v16[nq++] = (double)q->steps[i].bf16_delta_bytes;
        }
    for (size_t i = 0; b && i < b->nsteps; i++)
        if (b->steps[i].published) {
            bx[nb] = (double)b->steps[i].pub_version;
            bb[nb++] = (double)b->steps[i].delta_bytes;
        }
    /* patches only: the checkpoints (in the text) would flatten them */
    series s[3];
    size_t ns = 0;
    s[ns++] = (series){"FP8 patch (shipped)", k_colors[1], vx, v8, nq, 0};
    s[ns++] = (series){"BF16 patch, same step", k_colors[0], vx, v16, nq, 1};
    if (b) s[ns++] = (series){"BF16 leg's patch", k_colors[2], bx, bb, nb, 0};
    char x1[32], x2[32], x3[32], x4[32];
    mbs(x1, sizeof x1, q->delta_total);
    mbs(x2, sizeof x2, q->bf16_delta_total);
    mbs(x3, sizeof x3, q->full_bytes);
    mbs(x4, sizeof x4, q->bf16_full_bytes);
    fprintf(f, "<h2>FP8 rollouts</h2>\n<p>In the FP8 leg the trainer publishes each version as its FP8 checkpoint (");
    esc(f, ferry_quant_name((ferry_quant)q->quant));
    fprintf(f, ": E4M3 codes and one FP32 scale per 128&times;128 block of every 2-D weight with both dimensions &ge; 128; "
               "embeddings and the rest stay BF16) and ships it as patches of FP8 codes; the islands hold exactly that checkpoint "
               "(verified by hash) and sample with its dequantized values, while the trainer keeps learning on its FP32 masters. "
               "Its %" PRIu64 " versions took %s of deltas, against %s for the BF16 patches of the same steps (%.2fx); an FP8 checkpoint "
               "is %s, a BF16 one %s.",
            q->versions, x1, x2, q->bf16_delta_total ? (double)q->delta_total / (double)q->bf16_delta_total : 0, x3, x4);
    if (b)
        fprintf(f, " Mean reward over the last %d steps: %.3f with FP8 weights, %.3f with BF16 weights (first %d steps: %.3f and "
                   "%.3f).",
                q->window, q->reward_last, b->reward_last, q->window, q->reward_first, b->reward_first);
    fprintf(f, " The logits of the weights the islands sample with, against those of the BF16 version, on %u prompts of the task "
               "and every teacher-forced context of their answers: max |&Delta;| %.3g, mean |&Delta;| %.3g, mean KL(BF16 || FP8) %.3g "
               "nats per context, the same argmax in %.2f%% of the contexts (over %" PRIu64 " versions).",
            DEMO_PROBE_PROMPTS, q->fp8_logit_max, q->fp8_logit_mean, q->fp8_kl, 100 * q->fp8_top1, q->probes);
    fprintf(f, "</p>\n<div class=\"grid\">\n");
    line_chart(f, "bytes per version: FP8 patch vs BF16 patch", "policy version", s, ns, FMT_BYTES, 0, NULL, NULL, NULL, 0);
    series ls[2] = {{"max |logit diff|", k_colors[1], vx, lmax, nq, 0}, {"mean |logit diff|", k_colors[0], vx, lmean, nq, 1}};
    line_chart(f, "logits of the FP8 weights vs the BF16 version", "policy version", ls, 2, FMT_PLAIN, 0, NULL, NULL, NULL, 0);
    fprintf(f, "</div>\n<table><tr><th>step</th><th>version</th><th>FP8 patch</th><th>BF16 patch, same step</th><th>FP8 / BF16</th>"
               "<th>max |&Delta;logit|</th><th>KL, nats</th><th>reward, FP8 leg</th>%s</tr>\n",
            b ? "<th>BF16 leg: patch</th><th>reward, BF16 leg</th>" : "");
    for (size_t i = 0; i < q->nsteps; i++) {
        const demo_step *st = &q->steps[i];
        fprintf(f, "<tr><td>%u</td>", st->step);
        if (st->published)
            fprintf(f, "<td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%.2f</td><td>%.3g</td><td>%.3g</td>",
                    st->pub_version, st->delta_bytes, st->bf16_delta_bytes,
                    st->bf16_delta_bytes ? (double)st->delta_bytes / (double)st->bf16_delta_bytes : 0, st->fp8_logit_max, st->fp8_kl);
        else
            fprintf(f, "<td>(held)</td><td>&ndash;</td><td>&ndash;</td><td>&ndash;</td><td>&ndash;</td><td>&ndash;</td>");
        fprintf(f, "<td>%.3f</td>", st->reward);
        if (b && i < b->nsteps)
            fprintf(f, "<td>%" PRIu64 "</td><td>%.3f</td>", b->steps[i].delta_bytes, b->steps[i].reward);
        else if (b)
            fprintf(f, "<td></td><td></td>");
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</table>\n");
    free(a);
    return 0;
}

int demo_report_write(const char *path, const demo_report_info *in, const demo_leg *legs, size_t nlegs)
{
    char *doc = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&doc, &len);
    if (!f) return FERRY_ERR_NOMEM;
    size_t maxn = 1;
    for (size_t l = 0; l < nlegs; l++)
        if (legs[l].nsteps + 1 > maxn) maxn = legs[l].nsteps + 1;
    /* per leg: 9 arrays of maxn doubles */
    double *buf = calloc(nlegs * 9 * maxn + 1, sizeof *buf);
    if (!buf) {
        fclose(f);
        free(doc);
        return FERRY_ERR_NOMEM;
    }
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    esc(f, in->title);
    fprintf(f, "</title>\n<style>\n"
               "body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1000px;"
               "color:#222;padding:0 16px}\n"
               "h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px}\n"
               "table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
               " th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}\n"
               ".grid{display:flex;flex-wrap:wrap;gap:8px} svg{background:#fff;border:1px solid #e3e3e3}\n"
               "svg .t{font-size:14px;font-weight:600} svg .g{stroke:#eee} svg .a{stroke:#888}\n"
               "svg .yl{font-size:11px;text-anchor:end;fill:#555} svg .xl{font-size:11px;text-anchor:middle;fill:#555}\n"
               "svg .lg{font-size:12px;fill:#333} svg .bl{font-size:10px;text-anchor:middle;fill:#333}\n"
               "svg .ev{stroke:#999;stroke-dasharray:3,3} svg .evl{font-size:10px;fill:#666}\n"
               ".note{color:#555;font-size:13px}\n"
               "</style></head><body>\n<h1>");
    esc(f, in->title);
    int any_quant = 0;
    for (size_t l = 0; l < nlegs; l++) any_quant |= legs[l].quant != 0;
    fprintf(f, "</h1>\n<p class=\"note\">One trainer (FP32 masters, AdamW, GRPO) and %u rollout islands (separate processes, BF16 "
               "weights%s) sharing only the object store <code>",
            in->islands, any_quant ? "; in the FP8 leg the FP8 checkpoint of each version, dequantized to sample" : "");
    esc(f, in->store_url);
    fprintf(f, "</code>. Policy versions travel as ferry patches through the sync layer%s; trajectories as version-tagged "
               "batches through the dock.</p>\n",
            in->full_sync ? " (here: a full checkpoint per version, the baseline)" : "");
    fprintf(f, "<table><tr><th>setting</th><th>value</th></tr>\n"
               "<tr><td>mode</td><td>%s%s</td></tr>\n",
            in->mode, !strcmp(in->mode, "async") ? "" : " pull");
    if (!strcmp(in->mode, "async")) fprintf(f, "<tr><td>max staleness</td><td>%" PRIu64 " versions</td></tr>\n", in->max_staleness);
    fprintf(f, "<tr><td>policy</td><td>%zu parameters</td></tr>\n<tr><td>task</td><td>%s, %u digits</td></tr>\n"
               "<tr><td>batch per step</td><td>%u prompts &times; %u samples</td></tr>\n<tr><td>AdamW lr</td><td>%g</td></tr>\n"
               "<tr><td>seed</td><td>%" PRIu64 "</td></tr>\n<tr><td>starting policy</td><td>",
            in->params, in->task, in->digits, in->prompts, in->group, in->lr, in->seed);
    esc(f, in->base ? in->base : "seeded random weights");
    fprintf(f, "</td></tr>\n<tr><td>machine</td><td>");
    esc(f, in->machine);
    fprintf(f, "</td></tr></table>\n");

    /* summary table, one column per leg */
    fprintf(f, "<h2>Summary</h2>\n<table><tr><th></th>");
    for (size_t l = 0; l < nlegs; l++) {
        fprintf(f, "<th>");
        esc(f, legs[l].name);
        fprintf(f, "</th>");
    }
    fprintf(f, "</tr>\n");
#define ROW(label, ...)                                                                                                                \
    do {                                                                                                                               \
        fprintf(f, "<tr><td>%s</td>", label);                                                                                          \
        for (size_t l = 0; l < nlegs; l++) {                                                                                           \
            const demo_leg *L = &legs[l];                                                                                              \
            char c1[32], c2[32];                                                                                                       \
            (void)c1;                                                                                                                  \
            (void)c2;                                                                                                                  \
            fprintf(f, "<td>");                                                                                                        \
            __VA_ARGS__;                                                                                                               \
            fprintf(f, "</td>");                                                                                                       \
        }                                                                                                                              \
        fprintf(f, "</tr>\n");                                                                                                         \
    } while (0)
    ROW("rollout weights", fprintf(f, "%s", L->quant ? "FP8 E4M3, 128&times;128 block scales" : "BF16"); if (L->quant) {
        fprintf(f, " (");
        esc(f, ferry_quant_name((ferry_quant)L->quant));
        fprintf(f, ")");
    });
    ROW("steps / wall time", fprintf(f, "%zu / %.1f s", L->nsteps, L->seconds));
    ROW("time-to-fresh policy (publish start &rarr; last island synced, verified)",
        fprintf(f, "mean %.1f ms, max %.1f ms (%" PRIu64 " versions)", L->fresh_mean_ms, L->fresh_max_ms, L->fresh_known));
    ROW("islands' time waiting for weights", fprintf(f, "%.1f%%", 100 * L->wait_share));
    ROW("mean reward, first steps", fprintf(f, "%.3f (%d steps)", L->reward_first, L->window));
    ROW("mean reward, last steps", fprintf(f, "%.3f (%d steps)", L->reward_last, L->window));
    ROW("versions published", fprintf(f, "%" PRIu64 " (%" PRIu64 " anchors)", L->versions, L->anchors));
    ROW("ferry bytes uploaded", mbs(c1, sizeof c1, L->delta_total + L->anchor_total); mbs(c2, sizeof c2, L->delta_total);
        fprintf(f, "%s (deltas %s)", c1, c2));
    ROW("same versions as full checkpoints", mbs(c1, sizeof c1, L->versions * L->full_bytes);
        fprintf(f, "%s (%.1fx more)", c1,
                L->delta_total + L->anchor_total ? (double)(L->versions * L->full_bytes) / (double)(L->delta_total + L->anchor_total)
                                                 : 0));
    ROW("bytes the islands fetched", mbs(c1, sizeof c1, L->fetched_total); fprintf(f, "%s", c1));
    if (any_quant) {
        ROW("full checkpoint shipped (anchor)", mbs(c1, sizeof c1, L->full_bytes); fprintf(f, "%s (%s)", c1, L->quant ? "FP8" : "BF16"));
        ROW("logits of the FP8 weights vs the BF16 version (probe set)",
            if (L->quant) fprintf(f, "max |&Delta;| %.3g, mean |&Delta;| %.3g, KL %.3g nats, same argmax %.2f%% (%" PRIu64 " versions)",
                                  L->fp8_logit_max, L->fp8_logit_mean, L->fp8_kl, 100 * L->fp8_top1, L->probes);
            else fprintf(f, "&ndash;"));
        ROW("BF16 patches of the same steps (FP8 leg: measured, not shipped)",
            if (L->quant) {
                mbs(c1, sizeof c1, L->bf16_delta_total);
                fprintf(f, "%s (the FP8 deltas are %.2fx of it)", c1,
                        L->bf16_delta_total ? (double)L->delta_total / (double)L->bf16_delta_total : 0);
            } else fprintf(f, "&ndash;"));
    }
    ROW("batches consumed / dropped stale", fprintf(f, "%" PRIu64 " / %" PRIu64, L->admitted - L->discarded, L->dropped));
    ROW("duplicates / rejected / discarded", fprintf(f, "%" PRIu64 " / %" PRIu64 " / %" PRIu64, L->duplicates, L->rejected, L->discarded));
    ROW("batches of restarted islands", fprintf(f, "%" PRIu64, L->restarted_batches));
#undef ROW
    fprintf(f, "</table>\n");

    /* series */
    series rs[4] = {{0}}, bs[6] = {{0}}, cs[6] = {{0}}, ch[4] = {{0}}, fr[4] = {{0}};
    size_t nrs = 0, nbs = 0, ncs = 0, nch = 0, nfr = 0;
    double full_x[2], full_y[2], fullc_x[2], fullc_y[2];
    double vx[64] = {0};
    const char *vlab[64] = {0}, *vcol[64] = {0};
    char vtxt[64][48];
    size_t nv = 0;
    uint64_t fb = 0, fc_max = 0;
    double vmax = 1;
    for (size_t l = 0; l < nlegs; l++) {
        const demo_leg *L = &legs[l];
        double *a = buf + l * 9 * maxn;
        double *sx = a, *sr = a + maxn, *vxs = a + 2 * maxn, *vb = a + 3 * maxn, *cx = a + 4 * maxn, *cb = a + 5 * maxn,
               *chy = a + 6 * maxn, *fx = a + 7 * maxn, *fy = a + 8 * maxn;
        size_t nvv = 0, nf = 0;
        double cum = (double)(L->anchors ? L->full_bytes : 0); /* version 1 */
        uint64_t versions = 1;
        cx[0] = 0;
        cb[0] = cum;
        for (size_t i = 0; i < L->nsteps; i++) {
            const demo_step *s = &L->steps[i];
            sx[i] = s->step;
            sr[i] = s->reward;
            chy[i] = 100 * s->changed;
            if (s->published && s->fresh_ms >= 0) {
                fx[nf] = (double)s->pub_version;
                fy[nf++] = s->fresh_ms;
            }
            if (s->published) {
                vxs[nvv] = (double)s->pub_version;
                vb[nvv] = (double)s->delta_bytes;
                nvv++;
                cum += (double)(s->delta_bytes + s->anchor_bytes);
                versions++;
            }
            cx[i + 1] = s->step + 1;
            cb[i + 1] = cum;
        }
        if ((double)versions > vmax) vmax = (double)versions;
        if (L->full_bytes > fb) fb = L->full_bytes;
        if (versions * L->full_bytes > fc_max) fc_max = versions * L->full_bytes;
        const char *col = k_colors[l % 5];
        rs[nrs++] = (series){L->name, col, sx, sr, L->nsteps, 0};
        bs[nbs++] = (series){L->name, col, vxs, vb, nvv, 0};
        cs[ncs++] = (series){L->name, col, cx, cb, L->nsteps + 1, 0};
        ch[nch++] = (series){L->name, col, sx, chy, L->nsteps, 0};
        fr[nfr++] = (series){L->name, col, fx, fy, nf, 0};
        for (size_t e = 0; e < L->nevents && nv < 64; e++) {
            if (L->events[e].kind == DEMO_EV_DIED || L->events[e].kind == DEMO_EV_REJOIN) continue;
            vx[nv] = L->events[e].step;
            snprintf(vtxt[nv], sizeof vtxt[nv], "%s island %u", L->events[e].kind == DEMO_EV_KILL ? "kill -9" : "restart",
                     L->events[e].island);
            vlab[nv] = vtxt[nv];
            vcol[nv] = col;
            nv++;
        }
    }
    full_x[0] = 1, full_x[1] = vmax;
    /* fb: the largest checkpoint shipped (for the cumulative line);
     * the BF16 checkpoint is every leg's reference */
    uint64_t fb16 = 0;
    for (size_t l = 0; l < nlegs; l++)
        if (legs[l].bf16_full_bytes > fb16) fb16 = legs[l].bf16_full_bytes;
    full_y[0] = full_y[1] = (double)(fb16 ? fb16 : fb);
    bs[nbs++] = (series){"full BF16 checkpoint", "#555", full_x, full_y, 2, 1};
    /* full checkpoints, cumulative: a straight line from version 1 */
    fullc_x[0] = 0, fullc_x[1] = nlegs ? (double)legs[0].nsteps : 0;
    fullc_y[0] = (double)fb, fullc_y[1] = (double)fc_max;
    cs[ncs++] = (series){"full checkpoints", "#555", fullc_x, fullc_y, 2, 1};

    fprintf(f, "<h2>Learning</h2>\n<div class=\"grid\">\n");
    line_chart(f, any_quant ? "mean reward per step (rollouts with the islands' BF16 or FP8 weights)"
                            : "mean reward per step (rollouts with the islands' BF16 weights)", "trainer step", rs, nrs, FMT_PLAIN, 1.0, vx, vlab,
               vcol, nv);
    line_chart(f, "BF16 words changed since the last published version", "trainer step", ch, nch, FMT_PCT, 1.0, NULL, NULL, NULL, 0);
    fprintf(f, "</div>\n<h2>Bytes on the wire</h2>\n<div class=\"grid\">\n");
    line_chart(f, "bytes per version: ferry delta vs full checkpoint", "policy version", bs, nbs, FMT_BYTES, 0, NULL, NULL, NULL, 0);
    line_chart(f, "cumulative bytes published (anchors included)", "trainer steps done", cs, ncs, FMT_BYTES, 0, NULL, NULL, NULL, 0);
    line_chart(f, "time-to-fresh-policy, ms: publish start -> last island synced and verified", "policy version", fr, nfr, FMT_PLAIN, 0,
               NULL, NULL, NULL, 0);
    fprintf(f, "</div>\n<p class=\"note\">A ferry delta holds exactly the BF16 words that changed (positions by exponent class, "
               "values as ULP deltas, range-coded); islands verify base and result hashes, so the weights they sample with are "
               "bit-identical to the trainer's cast. Anchors (full checkpoints) are published every few versions so that a new or "
               "restarted island can join from the nearest one.</p>\n");
    size_t nb = 1;
    for (size_t l = 0; l < nlegs; l++)
        for (size_t b = 0; b < FERRY_DOCK_HIST; b++)
            if (legs[l].stale_hist[b] && b + 1 > nb) nb = b + 1;
    if (nb < 3) nb = 3;
    fprintf(f, "<h2>Staleness</h2>\n<div class=\"grid\">\n");
    bar_chart(f, "consumed batches by staleness (trainer version - batch version)", "staleness (versions)", legs, nlegs, nb);
    fprintf(f, "</div>\n");
    if (any_quant && fp8_section(f, legs, nlegs)) {
        free(buf);
        fclose(f);
        free(doc);
        return FERRY_ERR_NOMEM;
    }
    if (nlegs > 1 && legs[1].adaptive > 0) {
        const demo_leg *a = &legs[0], *b = &legs[1];
        char x1[32], x2[32];
        mbs(x1, sizeof x1, a->delta_total + a->anchor_total);
        mbs(x2, sizeof x2, b->delta_total + b->anchor_total);
        fprintf(f, "<h2>Adaptive publication</h2>\n<p>");
        esc(f, b->name);
        char y1[32], y2[32];
        mbs(y1, sizeof y1, a->fetched_total);
        mbs(y2, sizeof y2, b->fetched_total);
        fprintf(f, " published %" PRIu64 " versions in %zu steps (against %" PRIu64 "), uploading %s against %s (%.0f%%); the islands "
                   "fetched %s against %s (%.0f%%); mean reward over the last %d steps %.3f against %.3f; wall time %.1f s against "
                   "%.1f s.</p>\n",
                b->versions, b->nsteps, a->versions, x2, x1,
                a->delta_total + a->anchor_total
                    ? 100.0 * (double)(b->delta_total + b->anchor_total) / (double)(a->delta_total + a->anchor_total)
                    : 0,
                y2, y1, a->fetched_total ? 100.0 * (double)b->fetched_total / (double)a->fetched_total : 0, b->window,
                b->reward_last, a->reward_last, b->seconds, a->seconds);
    }
    if (nv) {
        fprintf(f, "<h2>Island churn</h2>\n<ul>\n");
        for (size_t l = 0; l < nlegs; l++)
            for (size_t e = 0; e < legs[l].nevents; e++) {
                fprintf(f, "<li>step %u: ", legs[l].events[e].step);
                esc(f, legs[l].events[e].what);
                fprintf(f, "</li>\n");
            }
        fprintf(f, "</ul>\n");
    }
    fprintf(f, "<p class=\"note\">Trajectory hash (every consumed batch, in order) and final FP32 masters hash:");
    for (size_t l = 0; l < nlegs; l++) {
        fprintf(f, "<br>");
        esc(f, legs[l].name);
        fprintf(f, ": <code>%s</code> / <code>%s</code>", legs[l].traj_hash, legs[l].masters_hash);
    }
    fprintf(f, "</p>\n<p class=\"note\">Written by <code>ferry-demo</code> (ferry %s).</p>\n</body></html>\n", ferry_version());
    free(buf);
    if (fclose(f)) {
        free(doc);
        return FERRY_ERR_NOMEM;
    }
    int rc = ferry_file_write(path, doc, len);
    free(doc);
    return rc;
}
