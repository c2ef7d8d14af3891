#!/usr/bin/env python3
"""Summarises bench/loco.sh's runs (bench/results/loco/PHASE/*.jsonl) as
markdown: bytes per round and in total for PULSELoCo, DiLoCo and DDP, the
ratios, gated shares, and the reward curves across seeds (mean, seed
spread, and PULSELoCo minus DiLoCo).  Standard library only."""
import glob
import json
import os
import re
import statistics
import sys

MODES = ("pulseloco", "diloco", "ddp")


def load(path):
    start, rounds, summary = None, [], None
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if o.get("event") == "start":
                start = o
            elif o.get("event") == "summary":
                summary = o
            else:
                rounds.append(o)
    return start, rounds, summary


def runs(phase_dir):
    out = {}
    for p in sorted(glob.glob(os.path.join(phase_dir, "*.jsonl"))):
        m = re.match(r"(\w+)-lr(.+)-s(\d+)\.jsonl$", os.path.basename(p))
        if not m:
            continue
        start, rounds, summary = load(p)
        if summary is None:
            continue
        out.setdefault((m.group(2), m.group(1)), {})[int(m.group(3))] = (start, rounds, summary)
    return out


def mb(x):
    return "%.2f MB" % (x / 1e6)


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else float("nan")


def fmt(x, spec="%.4f"):
    """A number, or "-" where there is none (sd of one seed, absent mode)."""
    return "-" if x is None or x != x else spec % x


def window_mean(rounds, k):
    return statistics.mean(r["reward"] for r in rounds[-k:])


def phase_report(name, phase_dir, tracking=False, preamble=(), borrow=None):
    """borrow: {mode: other phase dir} -- that mode's runs come from the other
    phase (DDP, which has no outer step, in a phase that only varies it)."""
    rs = runs(phase_dir)
    if not rs:
        return []
    for m, d in (borrow or {}).items():
        for (lr, mode), v in runs(d).items():
            if mode == m and (lr, mode) not in rs and any(k[0] == lr for k in rs):
                rs[(lr, mode)] = v
    lines = ["## %s" % name, ""] + list(preamble)
    for lr in sorted({k[0] for k in rs}, key=float):
        by_mode = {m: rs.get((lr, m), {}) for m in MODES}
        any_run = next(v for v in by_mode.values() if v)
        start = next(iter(any_run.values()))[0]
        # The seeds PULSELoCo and DiLoCo share; a mode run on fewer of them
        # (DDP still under way) is left out rather than shrinking the table.
        core = [set(by_mode[m]) for m in ("pulseloco", "diloco") if by_mode[m]]
        seeds = sorted(set.intersection(*(core or [set(v) for v in by_mode.values() if v])))
        for m in MODES:
            if by_mode[m] and not set(seeds) <= set(by_mode[m]):
                by_mode[m] = {}
        nr = start["rounds"]
        k = max(1, nr // 5)
        lines += ["### inner lr %s: %d ranks, H %d, %d rounds (%d local steps per rank), %d params, seeds %s"
                  % (lr, start["ranks"], start["h"], nr, nr * start["h"], start["params"],
                     " ".join(map(str, seeds))), ""]
        lines += ["| mode | bytes/round (all ranks) | total bytes | DiLoCo / mode | DDP / mode | gated share first/last round (mean) | bytes per sent entry | reward round 0 | reward last %d rounds (mean ± sd over seeds) |" % k,
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        totals = {}
        for m in MODES:
            if not by_mode[m]:
                continue
            tot = statistics.mean(by_mode[m][s][2]["bytes_total"] for s in seeds)
            totals[m] = tot
        for m in MODES:
            if m not in totals:
                continue
            rr = [by_mode[m][s][1] for s in seeds]
            per_round = totals[m] / nr
            g0 = statistics.mean(r[0]["gated_fraction"] for r in rr)
            gl = statistics.mean(r[-1]["gated_fraction"] for r in rr)
            last = [window_mean(r, k) for r in rr]
            r0 = statistics.mean(r[0]["reward"] for r in rr)
            gm = statistics.mean(by_mode[m][s][2]["mean_gated_fraction"] for s in seeds)
            sent = statistics.mean(sum(x["gated"] for x in r) for r in rr)
            lines.append("| %s | %s | %s | %s | %s | %.1f%% / %.1f%% (%.1f%%) | %.2f | %.4f | %.4f ± %s |" % (
                m, mb(per_round), mb(totals[m]),
                "%.1fx" % (totals["diloco"] / totals[m]) if "diloco" in totals else "-",
                "%.1fx" % (totals["ddp"] / totals[m]) if "ddp" in totals else "-",
                100 * g0, 100 * gl, 100 * gm, totals[m] / sent if m == "pulseloco" else 4.0 if m == "diloco" else 4.0,
                r0, statistics.mean(last), fmt(sd(last))))
        lines.append("")
        # Reward curves: mean over seeds per round, the seed spread, and the
        # PULSELoCo - DiLoCo gap against that spread.
        if by_mode["pulseloco"] and by_mode["diloco"]:
            lines += ["Reward per round (mean over seeds; sd = standard deviation over seeds):", "",
                      "| round | steps | pulseloco | sd | diloco | sd | ddp | sd | pulse - diloco |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            gaps, sds = [], []
            step = max(1, nr // 10)
            for i in range(nr):
                vals = {m: [by_mode[m][s][1][i]["reward"] for s in seeds] for m in MODES if by_mode[m]}
                gap = statistics.mean(vals["pulseloco"]) - statistics.mean(vals["diloco"])
                gaps.append(gap)
                sds.append((sd(vals["pulseloco"]) + sd(vals["diloco"])) / 2)
                if i % step == 0 or i == nr - 1:
                    d = vals.get("ddp")
                    lines.append("| %d | %d | %.4f | %s | %.4f | %s | %s | %s | %+.4f |" % (
                        i, (i + 1) * start["h"], statistics.mean(vals["pulseloco"]), fmt(sd(vals["pulseloco"])),
                        statistics.mean(vals["diloco"]), fmt(sd(vals["diloco"])),
                        fmt(statistics.mean(d) if d else None), fmt(sd(d) if d else None), gap))
            lines += ["", "Over all %d rounds: mean |pulse - diloco| = %.4f, mean seed sd = %s; "
                      "last %d rounds: pulse - diloco = %+.4f (seed sd of that window: pulse %s, diloco %s)."
                      % (nr, statistics.mean(abs(g) for g in gaps), fmt(statistics.mean(sds)), k,
                         statistics.mean(gaps[-k:]),
                         fmt(sd([window_mean(by_mode["pulseloco"][s][1], k) for s in seeds])),
                         fmt(sd([window_mean(by_mode["diloco"][s][1], k) for s in seeds]))), ""]
            if tracking:
                lines += tracking_report(by_mode, seeds, nr, k, gaps, sds)
    return lines


def tracking_report(by_mode, seeds, nr, k, gaps, sds):
    """How closely PULSELoCo's curve follows DiLoCo's, against the seed
    spread: rounds within one seed sd, the systematic part of the gap
    (its mean over rounds, per seed, and the spread of that over seeds),
    the reward each gained over the run, and the shift in rounds that best
    lines the two mean curves up."""
    lines = []
    within = sum(1 for g, d in zip(gaps, sds) if abs(g) <= d)
    per_seed = [statistics.mean(by_mode["pulseloco"][s][1][i]["reward"] - by_mode["diloco"][s][1][i]["reward"]
                                for i in range(nr)) for s in seeds]
    mean_ps = statistics.mean(per_seed)
    se = sd(per_seed) / len(per_seed) ** 0.5 if len(per_seed) > 1 else float("nan")
    gain = {}
    for m in MODES:
        if by_mode[m]:
            g = [window_mean(by_mode[m][s][1], k) - statistics.mean(r["reward"] for r in by_mode[m][s][1][:k])
                 for s in seeds]
            gain[m] = (statistics.mean(g), sd(g))
    curve = {m: [statistics.mean(by_mode[m][s][1][i]["reward"] for s in seeds) for i in range(nr)]
             for m in ("pulseloco", "diloco")}
    best = None
    for shift in range(0, max(1, nr // 3)):
        # pulse at round i against diloco at round i - shift (pulse behind by shift rounds)
        err = statistics.mean((curve["pulseloco"][i] - curve["diloco"][i - shift]) ** 2 for i in range(shift, nr))
        if best is None or err < best[1]:
            best = (shift, err)
    within_txt = ("|pulse - diloco| <= mean seed sd in %d of %d rounds" % (within, nr) if len(seeds) > 1
                  else "one seed, so no seed spread to compare with")
    q = max(1, nr // 4)
    quarters = [statistics.mean(gaps[i:i + q]) for i in range(0, nr - nr % q if nr >= 4 else nr, q)]
    pos = sum(1 for g in gaps if g > 0)
    lines += ["Gap by quarter of the run (drift): %s; PULSELoCo above DiLoCo in %d of %d rounds, below in %d."
              % (" ".join("%+.4f" % x for x in quarters), pos, nr, sum(1 for g in gaps if g < 0)), ""]
    lines += ["Tracking: %s; the gap averaged over all rounds "
              "is %+.4f (per seed %s; standard error over seeds %s); reward gained from the first %d rounds to "
              "the last %d: %s; the shift that best lines the mean curves up: PULSELoCo %d round(s) behind."
              % (within_txt, mean_ps, " ".join("%+.4f" % x for x in per_seed), fmt(se), k, k,
                 ", ".join("%s %+.4f ± %s" % (m, g[0], fmt(g[1])) for m, g in gain.items()), best[0]), ""]
    return lines


def sweep_report(phase_dir):
    rs = runs(phase_dir)
    if not rs:
        return []
    lines = ["## sweep: PULSELoCo's gated share against the inner learning rate", "",
             "| inner lr | gated share (mean of rounds) | bytes/round | bytes per gated entry | DiLoCo / pulse | DDP / pulse | reward first → last round |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for lr in sorted({k[0] for k in rs}, key=float, reverse=True):
        v = rs.get((lr, "pulseloco"))
        if not v:
            continue
        start, rounds, summ = v[min(v)]
        n, R, H = start["params"], start["ranks"], start["h"]
        per_round = summ["bytes_total"] / len(rounds)
        gated = sum(r["gated"] for r in rounds)
        dense = 4 * n * R
        lines.append("| %s | %.2f%% | %s | %.2f | %.1fx | %.1fx | %.4f → %.4f |" % (
            lr, 100 * summ["mean_gated_fraction"], mb(per_round), summ["bytes_total"] / max(gated, 1),
            dense / per_round, dense * H / per_round, rounds[0]["reward"], rounds[-1]["reward"]))
    lines += ["", "DiLoCo sends 4 bytes per weight and rank per round (%s here), DDP that every step." % mb(dense), ""]
    return lines


def rounds_of(phase_dir):
    """The round count in a phase directory named ...-rN (ranks4v2, ftllm)."""
    return int(re.search(r"-r(\d+)$", phase_dir).group(1))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench/results/loco"
    lines = ["# bench/loco: PULSELoCo, DiLoCo, DDP on the reference RL workload", ""]
    lines += phase_report("curves: the workload's default inner lr", os.path.join(out, "curves"))
    lines += phase_report("llm: an LLM-like inner lr (per-round moves below most BF16 cells)", os.path.join(out, "llm"))
    lines += sweep_report(os.path.join(out, "sweep"))
    lines += phase_report("llmlong: inner lr 2e-6 over a longer horizon (one seed)", os.path.join(out, "llmlong"))
    lines += phase_report("ranks4: four ranks", os.path.join(out, "ranks4"))
    ft = os.path.join(out, "finetune")
    pre = []
    log = os.path.join(ft, "pretrain.log")
    if os.path.exists(log):
        pre = ["Pre-training (rl_train, single process, saved with --save; every run below starts from it with "
               "--init, fresh AdamW and outer state):", "", "```"] + open(log).read().strip().splitlines() + ["```", ""]
    lines += phase_report("finetune: RL fine-tuning of a pre-trained policy", ft, tracking=True, preamble=pre)
    lines += phase_report("finetune-outer: the same fine-tune with outer lr 1, momentum 0 (one seed)",
                          os.path.join(out, "finetune-outer"), tracking=True)
    lines += phase_report("finetune-avg: the fine-tune with plain averaging as every mode's outer step "
                          "(outer lr 1, momentum 0)", os.path.join(out, "finetune-avg"), tracking=True)
    lines += phase_report("finetune-nest: finetune-avg's setting with outer lr 0.1, Nesterov momentum 0.9 "
                          "(long-run gain 1) for PULSELoCo and DiLoCo", os.path.join(out, "finetune-nest"),
                          tracking=True, borrow={"ddp": os.path.join(out, "finetune-avg")},
                          preamble=["DDP has no outer step (loco_train's DDP path never reads the outer "
                                    "options), so its rows are finetune-avg's DDP runs, the same bits as a "
                                    "rerun with outer lr 0.1 / momentum 0.9 would give.", ""])
    v2 = ["PULSELoCo with the outer gate and cell-coded values (loco_train's defaults); its DiLoCo and "
          "DDP rows are the runs of the phase named, which do not depend on PULSELoCo's options.", ""]
    lines += phase_report("finetune-v2: finetune's setting (outer lr 0.7, Nesterov 0.9), PULSELoCo with the outer gate",
                          os.path.join(out, "finetune-v2"), tracking=True, preamble=v2,
                          borrow={"diloco": ft, "ddp": ft})
    lines += phase_report("finetune-avg-v2: finetune-avg's setting (plain averaging), PULSELoCo with the outer gate",
                          os.path.join(out, "finetune-avg-v2"), tracking=True, preamble=v2,
                          borrow={"diloco": os.path.join(out, "finetune-avg"), "ddp": os.path.join(out, "finetune-avg")})
    for d in sorted(glob.glob(os.path.join(out, "finetune-ranks4-r*")), key=rounds_of):
        lines += phase_report("%s: finetune's setting on four ranks, PULSELoCo with the outer gate"
                              % os.path.basename(d), d, tracking=True)
    for d in sorted(glob.glob(os.path.join(out, "finetune-llm-r*")), key=rounds_of):
        lines += phase_report("%s: lower inner lr, larger H (closer to LLM fine-tuning), default outer step"
                              % os.path.basename(d), d, tracking=True)
    lines += phase_report("finetune-avglong: finetune-avg's seed 1 over twice the rounds",
                          os.path.join(out, "finetune-avglong"), tracking=True)
    for d in sorted(glob.glob(os.path.join(out, "finetune-mom-*"))):
        m = re.match(r"finetune-mom-o(.+)-m(.+)$", os.path.basename(d))
        if m:
            lines += phase_report("%s: finetune-avg's setting with outer lr %s, momentum %s (one seed)"
                                  % (os.path.basename(d), m.group(1), m.group(2)), d, tracking=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
