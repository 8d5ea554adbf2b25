#!/usr/bin/env python3
"""Compare `forkscore score` JSON results field by field against a reference result.

Usage: compare-scores.py REF.json OTHER.json [OTHER.json ...]
Prints, per other file: max |logit diff|, max |probability diff| and every field whose
selected value differs from the reference (with the reference's top-2 logit margin).
Exit status 0 always: this is a report, the thresholds live in docs/GPU.md.
"""
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main(ref_path, others):
    ref = load(ref_path)
    for path in others:
        got = load(path)
        max_logit = max_prob = 0.0
        changed = []
        for name, rf in ref["fields"].items():
            gf = got["fields"][name]
            for choice, rl in rf["logits"].items():
                max_logit = max(max_logit, abs(gf["logits"][choice] - rl))
            for choice, rp in rf["scores"].items():
                max_prob = max(max_prob, abs(gf["scores"][choice] - rp))
            if gf["value"] != rf["value"]:
                top = sorted(rf["logits"].values(), reverse=True)
                margin = top[0] - top[1] if len(top) > 1 else float("inf")
                changed.append(f"{name}: {rf['value']!r} -> {gf['value']!r} (ref margin {margin:.3e})")
        print(f"{path} vs {ref_path}: {len(ref['fields'])} fields, "
              f"max|logit diff| {max_logit:.3e}, max|prob diff| {max_prob:.3e}, "
              f"changed values {len(changed)}")
        for c in changed:
            print("  CHANGED", c)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
