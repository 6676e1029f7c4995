#!/usr/bin/env python3
"""Merges `fa4 bench` and bench/torch_cpu_sdpa.py JSON from one device run into one results file (the
bench/results schema: commit, gpu, host, date, rows) and prints a markdown table with fa4 / torch."""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fa4_json")
    ap.add_argument("torch_json")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    fa4 = json.load(open(a.fa4_json))
    torch = json.load(open(a.torch_json))
    doc = {"commit": a.commit, "gpu": None, "host": fa4["host"], "date": fa4["date"],
           "note": f"CPU backends on the GPU machine's host; torch {torch['torch']} with {torch['threads']} threads",
           "rows": fa4["rows"] + torch["rows"]}
    json.dump(doc, open(a.out, "w"), indent=2)
    key = lambda r: (r["pass"], r["dtype"], r["d"], r["seqlen"], r["causal"])
    theirs = {key(r): r for r in torch["rows"]}
    lines = [f"CPU, {doc['host']}, commit {a.commit}, {doc['date']}; b={fa4['rows'][0]['batch']}, "
             f"h={fa4['rows'][0]['heads']}, TFLOP/s (4·b·h·s²·d, backward 2.5×; backward timed alone)", "",
             "| pass | dtype | d | seqlen | fa4 | torch SDPA | fa4 / torch |", "|---|---|---|---|---|---|---|"]
    for r in fa4["rows"]:
        t = theirs.get(key(r))
        if t:
            lines.append(f"| {r['pass']} | {r['dtype']} | {r['d']} | {r['seqlen']} | {r['tflops']:.3f} | "
                         f"{t['tflops']:.3f} | {r['tflops'] / t['tflops']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.markdown:
        open(a.markdown, "w").write(text)


if __name__ == "__main__":
    main()
