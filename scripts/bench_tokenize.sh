#!/usr/bin/env bash
# The tokenizer bench (docs/perf.md, "Tokenizing with a tokenizer.json"): `moepeak data prepare`
# with a byte-level BPE tokenizer.json against Hugging Face tokenizers' encode_batch on the same
# generated corpus and the same cores.
#
#   scripts/bench_tokenize.sh [KIND] [MEGABYTES]        (defaults: qwen3 20)
#   HF_PYTHON=/path/to/venv/bin/python scripts/bench_tokenize.sh qwen3 20
#
# KIND is a fixture under tests/data/tokenizers/. The corpus (JSONL, made deterministically from
# the fixture's texts, shuffled into documents of 20-400 sentences) goes to $BENCH_DIR (default
# a temporary directory). moepeak's side: whole `data prepare` processes (reading, encoding on 2
# worker threads, writing), timed by farm-bench when it is installed, else by `time`. With
# HF_PYTHON (a Python with the tokenizers package; never needed to build or test moepeak): the
# best of three encode_batch calls over the texts already in memory (RAYON_NUM_THREADS=2), and a
# check that both give the same ids, token for token.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kind="${1:-qwen3}"
megabytes="${2:-20}"
bin="${MOEPEAK_BIN:-$root/build/moepeak}"
fixture="$root/tests/data/tokenizers/$kind"
[ -f "$fixture/tokenizer.json" ] || { echo "bench_tokenize: no fixture $fixture" >&2; exit 2; }
[ -x "$bin" ] || { echo "bench_tokenize: build moepeak first ($bin)" >&2; exit 2; }
dir="${BENCH_DIR:-$(mktemp -d)}"
mkdir -p "$dir"

/usr/bin/python3 - "$fixture/cases.jsonl" "$dir/corpus.jsonl" "$megabytes" <<'PY'
import json, random, sys
random.seed(11)
words = []
for line in open(sys.argv[1], encoding="utf-8"):
    if line.strip():
        words += json.loads(line)["text"].split()
target = int(sys.argv[3]) * 1000 * 1000
with open(sys.argv[2], "w", encoding="utf-8") as out:
    written = 0
    while written < target:
        sentences = [" ".join(random.choice(words) for _ in range(random.randint(3, 15)))
                     for _ in range(random.randint(20, 400))]
        line = json.dumps({"text": ". ".join(sentences) + "\n"}, ensure_ascii=False) + "\n"
        out.write(line)
        written += len(line.encode())
PY
echo "# corpus: $dir/corpus.jsonl ($(du -h "$dir/corpus.jsonl" | cut -f1)), tokenizer $fixture/tokenizer.json"

prepare=("$bin" data prepare --tokenizer "$fixture/tokenizer.json" --input "$dir/corpus.jsonl"
         --output "$dir/moepeak" --workers 2 --no-eos)
"${prepare[@]}" | grep -E '^(  all|# input)'
if command -v farm-bench >/dev/null; then
  farm-bench -n 5 --timeout 600 -- "${prepare[@]}"
else
  time "${prepare[@]}" >/dev/null
fi

if [ -n "${HF_PYTHON:-}" ]; then
  RAYON_NUM_THREADS=2 TOKENIZERS_PARALLELISM=true "$HF_PYTHON" - "$fixture/tokenizer.json" \
    "$dir/corpus.jsonl" "$dir/moepeak.bin" <<'PY'
import json, sys, time
import numpy as np
from tokenizers import Tokenizer, __version__
tok = Tokenizer.from_file(sys.argv[1])
texts = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
best = None
for _ in range(3):
    t0 = time.perf_counter()
    encodings = tok.encode_batch(texts)
    seconds = time.perf_counter() - t0
    best = seconds if best is None else min(best, seconds)
ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])
print(f"# tokenizers {__version__} encode_batch: {ids.size} tokens, best of 3 {best:.3f} s, "
      f"{ids.size / best:,.0f} tokens/s")
ours = np.fromfile(sys.argv[3], dtype=np.uint16 if tok.get_vocab_size() < 65536 else np.int32)
same = ours.size == ids.size and bool((ours.astype(np.int64) == ids).all())
print(f"# moepeak's ids {'equal' if same else 'DIFFER FROM'} tokenizers' ({ours.size} vs {ids.size})")
sys.exit(0 if same else 1)
PY
fi
