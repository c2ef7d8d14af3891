#!/usr/bin/env python3
"""Summarises bench/loco_wan.sh (bench/results/loco/wan): per mode and rank
count, the bytes loco_train counted per round, the bytes the rank links
carried per round (veth tx counters: payloads, MPI framing, TCP/IP
headers, the job's launch), the time in the exchange per round (rank 0's
sync_ms: gather, decode, outer step, hash check, and the wait for the
slowest rank) and the link's physical reference for that traffic (the
busiest-average uplink's bytes at the shaped rate).  Standard library only."""
import csv
import json
import os
import re
import statistics
import sys


def rate_bps(rate):
    m = re.match(r"([\d.]+)([kmg]?)bit$", rate)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench/results/loco/wan"
    rows = list(csv.DictReader(open(os.path.join(out, "links.tsv")), delimiter="\t"))
    lines = ["# loco over shaped links (bench/loco_wan.sh)", "",
             "| mode | ranks | link rate | rounds x H | payload bytes/round (all ranks) | link bytes/round (all rank uplinks) | "
             "exchange time/round (rank 0, median) | link reference/round | whole round (median) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = os.path.join(out, "%s-np%s-%s.jsonl" % (r["mode"], r["np"], r["rate"]))
        if not os.path.exists(f):
            continue
        rounds = [json.loads(l) for l in open(f) if l.startswith('{"round"')]
        if not rounds:
            continue
        nr, np_ = len(rounds), int(r["np"])
        payload = statistics.mean(x["bytes"] for x in rounds)
        link = int(r["link_tx_bytes"]) / nr
        sync = statistics.median(x.get("sync_ms", float("nan")) for x in rounds)
        whole = statistics.median(x["round_ms"] for x in rounds)
        # every uplink runs at the rate in parallel: the average uplink's
        # share of the round's link bytes, at that rate
        ref_ms = 1e3 * 8 * link / np_ / rate_bps(r["rate"])
        lines.append("| %s | %d | %s | %d x %s | %.0f | %.0f | %.0f ms | %.1f ms | %.0f ms |" % (
            r["mode"], np_, r["rate"], nr, r["h"], payload, link, sync, ref_ms, whole))
    lines += ["", "Link bytes include the job's start-up and TCP/IP and MPI framing; the reference is "
              "(link bytes per round / ranks) at the shaped rate, the time the average uplink needs for them.", ""]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
