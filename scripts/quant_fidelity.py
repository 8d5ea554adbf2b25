"""Fidelity of a quantized run against its unquantized reference, from two modes-bench dumps
(FORKSCORE_BENCH_DUMP) of the same cases: per case, how many fields keep their argmax code and
the largest |p_quantized - p_reference| over the softmax of each field's code logits
(temperature 1). Shared by scripts/cpu-real/report.py and scripts/gpu-real/quantized_report.py.
"""
import math


def softmax(logits):
    top = max(logits)
    e = [math.exp(x - top) for x in logits]
    s = sum(e)
    return [x / s for x in e]


def compare_case(ref_case, q_case):
    """{'agree': n, 'rows': n, 'max_abs_dp': x} over the rows both cases hold, or None when the
    cases were fed different token ids (then they cannot be compared)."""
    if ref_case is None or q_case is None:
        return None
    if ref_case.get("prefix_ids") != q_case.get("prefix_ids"):
        return None
    agree = rows = 0
    dp = 0.0
    for a, b in zip(ref_case.get("rows", []), q_case.get("rows", [])):
        if a.get("suffix_ids") != b.get("suffix_ids"):
            return None
        rows += 1
        agree += a["argmax_code_id"] == b["argmax_code_id"]
        pa, pb = softmax(a["logits"]), softmax(b["logits"])
        dp = max(dp, max(abs(x - y) for x, y in zip(pa, pb)))
    return {"agree": agree, "rows": rows, "max_abs_dp": dp}


def cases_by_fields(dump):
    """A dump's cases keyed by (fields, prefix tokens)."""
    return {(c["fields"], c["prefix_tokens"]): c for c in (dump or {}).get("cases", [])}
