"""bench/wan_report.py WORK OUT ...: turns the logs of bench/wan.sh into
OUT/wan.json, OUT/wan.txt and a self-contained OUT/wan.html (inline SVG,
no plotting library).

Inputs in WORK: pub-ROW.log ("V T_START T_END ..." per version), isl/ROW-DCK.log
("V TIME DECODE_S" per version an island reached; V counts steps, 0 = the
starting checkpoint), tx.log ("ROW BYTES_A BYTES_B"), dec_ferry.txt (ferry
apply times, into a new file), dec_lib.txt (the median in-place apply),
errors.log.
"""
import argparse
import glob
import html
import json
import os
import statistics

ROWS = [("full", "full checkpoints"), ("skyrl", "SkyRL XOR + zstd-3"),
        ("sparse", "prime-rl sparse (int32 idx + BF16 + zstd-3)"), ("ferry", "ferry"),
        ("mirror", "ferry + one mirror per island DC"),
        ("lib", "ferry library: long-lived publisher, in-memory subscribers"),
        ("libmirror", "ferry library + one mirror per island DC")]


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def load(work, versions):
    pub, pub_s = {}, {}
    for row, _ in ROWS:
        p = os.path.join(work, "pub-%s.log" % row)
        if os.path.exists(p):
            fs = [l.split() for l in open(p)]
            pub[row] = {int(f[0]): float(f[1]) for f in fs if len(f) >= 3}
            pub_s[row] = statistics.median([float(f[2]) - float(f[1]) for f in fs if len(f) >= 3] or [float("nan")])
    tx = {}
    for l in open(os.path.join(work, "tx.log")):
        row, a, b = l.split()
        tx[row] = {"a": int(a), "b": int(b)}
    dec_ferry = [float(x) for x in open(os.path.join(work, "dec_ferry.txt")).read().split()]
    p = os.path.join(work, "dec_lib.txt")
    dec_lib = float(open(p).read().split()[0]) if os.path.exists(p) else float("nan")
    p = os.path.join(work, "probe.txt")
    probe = [float(x) for x in open(p).read().split()] if os.path.exists(p) else []
    isl = {}
    for p in sorted(glob.glob(os.path.join(work, "isl", "*.log"))):
        name = os.path.basename(p)[:-4]
        row, who = name.rsplit("-", 1)
        reached = []
        for l in open(p):
            f = l.split()
            if len(f) >= 2:
                reached.append((int(f[0]), float(f[1]), float(f[2]) if len(f) > 2 and f[2] else None))
        isl.setdefault(row, {})[who] = reached
    errors = [l.strip() for l in open(os.path.join(work, "errors.log")) if l.strip()]
    return pub, pub_s, tx, dec_ferry, dec_lib, probe, isl, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("out")
    ap.add_argument("--islands", type=int)
    ap.add_argument("--period", type=float)
    ap.add_argument("--a-mbit", type=float)
    ap.add_argument("--b-mbit", type=float)
    ap.add_argument("--versions", type=int)
    ap.add_argument("--data")
    ap.add_argument("--delay-ms", type=float, default=0)
    ap.add_argument("--poll-ms", type=float, default=50)
    ap.add_argument("--name", default="wan")
    ap.add_argument("--load", default="")
    a = ap.parse_args()
    pub, pub_s, tx, dec_ferry, dec_lib, probe, isl, errors = load(a.work, a.versions)
    bw = {"a": a.a_mbit * 1e6 / 8, "b": a.b_mbit * 1e6 / 8}
    res = {"islands_per_dc": a.islands, "period_s": a.period, "links_mbit": {"a": a.a_mbit, "b": a.b_mbit},
           "delay_ms_one_way": a.delay_ms, "probe_mbit_direct_proxy": probe, "poll_ms": a.poll_ms, "load_average": a.load,
           "versions": a.versions, "data": a.data, "errors": errors, "rows": []}
    for row, title in ROWS:
        if row not in pub or row not in tx:
            continue
        r = {"row": row, "title": title, "publish_s": pub_s[row], "dc": {}}
        for dc in ("a", "b"):
            ttfp, dec = [], []
            missing = 0
            for who, reached in isl.get(row, {}).items():
                if not who.startswith(dc):
                    continue
                dec += [d for _, _, d in reached if d is not None]  # lib rows: the island's whole sync
                for v in range(1, a.versions + 1):
                    ts = [t for got, t, _ in reached if got >= v]
                    if not ts:
                        missing += 1
                        continue
                    ttfp.append(min(ts) - pub[row][v])
            if row == "full":
                decode = 0.0
            elif row in ("ferry", "mirror"):
                decode = statistics.median(dec_ferry)
            elif row in ("lib", "libmirror"):
                decode = dec_lib
                r.setdefault("island_sync_s", {})[dc] = statistics.median(dec) if dec else float("nan")
            else:
                decode = statistics.median(dec) if dec else float("nan")
            per_version = tx[row][dc] / a.versions
            ref = per_version / bw[dc] + decode
            p50 = pct(ttfp, 0.5)
            rtt = 2 * a.delay_ms / 1e3
            enc = ref + r["publish_s"]
            r["dc"][dc] = {"p50_s": p50, "p99_s": pct(ttfp, 0.99), "samples": len(ttfp), "missing": missing,
                           "link_bytes": tx[row][dc], "link_bytes_per_version": per_version, "decode_s": decode,
                           "reference_s": ref, "p50_over_reference": p50 / ref if ref > 0 else float("nan"),
                           "p50_over_reference_rtt": p50 / (ref + rtt) if ref + rtt > 0 else float("nan"),
                           "p50_over_reference_encode": p50 / enc if enc > 0 else float("nan")}
        res["rows"].append(r)
    for dc in ("a", "b"):
        best = min(res["rows"], key=lambda r: r["dc"][dc]["p50_s"])
        res["lowest_p50_" + dc] = best["row"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = ["bench/wan.sh: %d islands per DC, links a = %g Mbit/s, b = %g Mbit/s (tbf) + %g ms one-way (proxy), polls every %g ms, "
             "a version every %g s, %d versions of %s; load average %s"
             % (a.islands, a.a_mbit, a.b_mbit, a.delay_ms, a.poll_ms, a.period, a.versions, a.data, a.load),
             "%-9s %4s %8s %8s %12s %8s %8s %8s %9s %8s %9s" % ("row", "link", "p50 s", "p99 s", "link B/ver", "decode s", "ref s",
                                                                "p50/ref", "/ref+RTT", "pub s", "/ref+pub")]
    for r in res["rows"]:
        for dc in ("a", "b"):
            d = r["dc"][dc]
            lines.append("%-9s %4s %8.3f %8.3f %12d %8.3f %8.3f %8.2f %9.2f %8.3f %9.2f%s" % (
                r["row"], dc, d["p50_s"], d["p99_s"], d["link_bytes_per_version"], d["decode_s"], d["reference_s"],
                d["p50_over_reference"], d["p50_over_reference_rtt"], r["publish_s"], d["p50_over_reference_encode"],
                "  (%d missing)" % d["missing"] if d["missing"] else ""))
    lines.append("lowest p50: link a %s, link b %s" % (res["lowest_p50_a"], res["lowest_p50_b"]))
    for r in res["rows"]:
        if "island_sync_s" in r:
            lines.append("%s: an island's ferry_subscriber_sync (HEAD from the wait, manifest, delta, in-place apply), median: "
                         "link a %.3f s, link b %.3f s" % (r["row"], r["island_sync_s"]["a"], r["island_sync_s"]["b"]))
    lines.append("ref = link bytes per version / bandwidth + decode; RTT = 2 x the one-way delay; pub = the trainer's publish "
                 "(encode, objects, HEAD), median")
    if len(probe) == 2:
        lines.append("a 32 MiB GET over link a: %.1f Mbit/s straight, %.1f Mbit/s through the delay line" % tuple(probe))
    if errors:
        lines += ["ERROR: " + e for e in errors]
    text = "\n".join(lines) + "\n"
    open(os.path.join(a.out, a.name + ".txt"), "w").write(text)
    print(text, end="")
    open(os.path.join(a.out, a.name + ".html"), "w").write(page(res, text))


def bars(res, key, label, scale_fmt):
    """One horizontal bar per row and link; a tick at the reference when shown."""
    items = [(r["row"], dc, r["dc"][dc]) for r in res["rows"] for dc in ("a", "b")]
    vmax = max(max(d[key], d.get("reference_s", 0) if key == "p50_s" else 0) for _, _, d in items) or 1
    h = 22 * len(items) + 30
    out = ['<svg width="760" height="%d" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="12">' % h,
           '<text x="0" y="14" font-weight="bold">%s</text>' % html.escape(label)]
    for i, (row, dc, d) in enumerate(items):
        y = 24 + 22 * i
        w = 520 * d[key] / vmax
        color = "#2b7bb9" if dc == "a" else "#e08a1e"
        out.append('<text x="0" y="%d">%s, link %s</text>' % (y + 13, row, dc))
        out.append('<rect x="150" y="%d" width="%.1f" height="16" fill="%s"/>' % (y, w, color))
        out.append('<text x="%.1f" y="%d">%s</text>' % (155 + w, y + 13, scale_fmt(d[key])))
        if key == "p50_s":
            xr = 150 + 520 * d["reference_s"] / vmax
            out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="black" stroke-width="2"/>' % (xr, xr, y - 2, y + 18))
    out.append("</svg>")
    return "\n".join(out)


def page(res, text):
    return """<!doctype html><html><head><meta charset="utf-8"><title>ferry bench/wan</title></head>
<body style="font-family: sans-serif; max-width: 900px">
<h1>Time-to-fresh-policy over emulated WAN links</h1>
<p>Network namespaces joined by tbf-shaped veth links; the origin is reached through a userspace delay line
(%g ms one-way: this kernel has no netem).
Time-to-fresh-policy: from the moment the trainer starts publishing a version to the moment an island holds it
(or a newer one). Blue: link a; orange: link b. The black tick is the row's physical reference:
bytes on the link per version / bandwidth + decode time.</p>
%s
%s
<h2>Numbers</h2><pre>%s</pre>
</body></html>
""" % (res["delay_ms_one_way"], bars(res, "p50_s", "p50 time-to-fresh-policy (s)", lambda v: "%.2f s" % v),
       bars(res, "link_bytes_per_version", "bytes on the WAN link per version",
            lambda v: "%.2f MB" % (v / 1e6)), html.escape(text))


if __name__ == "__main__":
    main()
