#!/usr/bin/env bash
# `moepeak data prepare` end to end, with a SentencePiece model this test trains itself
# (Debian's spm_train) on text it generates: the ids of every document are spm_encode's, then
# EOS; text (blank-line separated) and JSONL inputs keep their order; --split 9,1 holds out every
# 10th document; the output is the same bytes on 1 and 2 worker threads and with a tiny chunk
# size; bad input is an error naming the file (and line) with nothing written; and the result
# trains (`moepeak train` on the train part with its eval part held out).
# Run: ctest -R test_data_prepare   (or: bash tests/cli/test_data_prepare.sh build/moepeak)
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shell_checks.sh"  # check, contains, report
py=/usr/bin/python3  # Debian's, with python3-numpy

# A corpus of made-up words: 300 text documents (1-3 lines each, blank-line separated) and 200
# JSONL ones.
"$py" - "$tmp" <<'PY'
import json, random, sys
tmp = sys.argv[1]
random.seed(7)
syll = ["ka", "lo", "mi", "ten", "ra", "vo", "shu", "pe", "din", "gro", "ul", "fi", "zan", "bo"]
words = ["".join(random.choice(syll) for _ in range(random.randint(1, 3))) for _ in range(300)]
def sentence():
    return " ".join(random.choice(words) for _ in range(random.randint(4, 18)))
docs = []
with open(f"{tmp}/corpus.txt", "w") as f:
    for d in range(300):
        lines = [sentence() for _ in range(random.randint(1, 3))]
        docs.append("\n".join(lines))
        f.write("\n".join(lines) + "\n\n")
with open(f"{tmp}/corpus.jsonl", "w") as f:
    for d in range(200):
        text = sentence()
        docs.append(text)
        f.write(json.dumps({"id": d, "text": text}) + "\n")
with open(f"{tmp}/docs.json", "w") as f:
    json.dump(docs, f)
PY
spm_train --input="$tmp/corpus.txt" --model_prefix="$tmp/tok" --vocab_size=300 \
  --hard_vocab_limit=false --model_type=unigram --minloglevel=2 >"$tmp/spm.log" 2>&1
check "spm_train made a model" test -s "$tmp/tok.model" || cat "$tmp/spm.log"

"$bin" data prepare --tokenizer "$tmp/tok.model" --input "$tmp/corpus.txt" "$tmp/corpus.jsonl" \
  --output "$tmp/all" --workers 2 --json "$tmp/all.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "prepare exits 0" test $rc -eq 0 || cat "$tmp/err"
check "the table names the part" grep -qE '^  all +500 ' "$tmp/out"
check "the table is #-commented" grep -q '^# part' "$tmp/out"

"$bin" data prepare --tokenizer "$tmp/tok.model" --input "$tmp/corpus.txt" "$tmp/corpus.jsonl" \
  --output "$tmp/split" --split 9,1 --workers 2 >"$tmp/out" 2>"$tmp/err"; rc=$?
check "prepare --split exits 0" test $rc -eq 0 || cat "$tmp/err"
check "the split table has both parts" grep -qE '^  eval +50 ' "$tmp/out"

# Every document's ids are spm_encode's, then the model's EOS (</s> = 2), in input order; the
# split holds out every 10th.
cat >"$tmp/verify.py" <<'PY'
import json, subprocess, sys
import numpy as np
tmp = sys.argv[1]
def read(prefix):
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "magic"
    code = idx[17]
    S = int.from_bytes(idx[18:26], "little"); D = int.from_bytes(idx[26:34], "little")
    lengths = np.frombuffer(idx, np.int32, S, 34)
    pointers = np.frombuffer(idx, np.int64, S, 34 + 4 * S)
    doc_idx = np.frombuffer(idx, np.int64, D, 34 + 12 * S)
    assert list(doc_idx) == list(range(S + 1)), "one document per sequence"
    dtype = {8: np.uint16, 4: np.int32}[code]
    bin_ = np.fromfile(prefix + ".bin", dtype)
    return [bin_[p // dtype().itemsize: p // dtype().itemsize + n].tolist()
            for p, n in zip(pointers, lengths)]
docs = json.load(open(f"{tmp}/docs.json"))
got = read(f"{tmp}/all")
assert len(got) == len(docs), (len(got), len(docs))
enc = subprocess.run(["spm_encode", f"--model={tmp}/tok.model", "--output_format=id"],
                     input="\n".join(d.replace("\n", " ") for d in docs) + "\n",
                     capture_output=True, text=True, check=True).stdout.splitlines()
# spm_encode reads a line per document: a text document's newlines were joined with spaces for
# it; SentencePiece normalises both to one whitespace, so the ids agree.
for i, (g, e) in enumerate(zip(got, enc)):
    want = [int(x) for x in e.split()] + [2]
    assert g == want, f"document {i}: {g[:10]} != {want[:10]}"
# The split: every 10th document (i % 10 == 9) in eval, the rest in train, in order.
train, held = read(f"{tmp}/split-train"), read(f"{tmp}/split-eval")
assert train == [d for i, d in enumerate(got) if i % 10 < 9], "train part"
assert held == [d for i, d in enumerate(got) if i % 10 == 9], "eval part"
print("verified", len(got), "documents,", len(train), "train,", len(held), "eval")
PY
"$py" "$tmp/verify.py" "$tmp" >"$tmp/verify.out" 2>&1; rc=$?
check "ids are spm_encode's + EOS, in order, and the split interleaves 9:1" test $rc -eq 0 ||
  cat "$tmp/verify.out"

# The same bytes whatever the threads and the chunk size.
"$bin" data prepare --tokenizer "$tmp/tok.model" --input "$tmp/corpus.txt" "$tmp/corpus.jsonl" \
  --output "$tmp/one" --workers 1 --chunk-size 100 >/dev/null 2>&1
check "1 worker, 100-byte chunks: the same .bin" cmp "$tmp/one.bin" "$tmp/all.bin"
check "1 worker, 100-byte chunks: the same .idx" cmp "$tmp/one.idx" "$tmp/all.idx"
check "the JSON summary counts the documents" contains "$tmp/all.json" '"documents": 500'

# Bad input: an error naming the file (and line), exit 1, nothing written.
printf '{"text": "fine"}\n{"txt": "no field"}\n' >"$tmp/bad.jsonl"
"$bin" data prepare --tokenizer "$tmp/tok.model" --input "$tmp/corpus.txt" "$tmp/bad.jsonl" \
  --output "$tmp/bad" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "a JSONL line without text exits 1" test $rc -eq 1
check "the error names the file and line" contains "$tmp/err" "$tmp/bad.jsonl:2: no \"text\" field"
check "nothing written after the error" test -z "$(ls "$tmp" | grep '^bad\.\(bin\|idx\)')"
check "no temporary file left" test -z "$(ls "$tmp" | grep '\.tmp\.')"
"$bin" data prepare --tokenizer "$tmp/missing.model" --input "$tmp/corpus.txt" \
  --output "$tmp/x" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "a missing tokenizer exits 1 naming it" contains "$tmp/err" "$tmp/missing.model: no such tokenizer"
"$bin" data prepare --tokenizer "$tmp/corpus.txt" --input "$tmp/corpus.txt" \
  --output "$tmp/x" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "a file that is no model exits 1" test $rc -eq 1
check "... naming it" contains "$tmp/err" "$tmp/corpus.txt: not a SentencePiece model"
"$bin" data prepare --tokenizer "$tmp/tok.model" --input "$tmp/nope.txt" \
  --output "$tmp/x" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "a missing input names it" contains "$tmp/err" "$tmp/nope.txt: no such input file"
"$bin" data prepare --tokenizer "$tmp/tok.model" --input "$tmp/corpus.txt" --split 9,0 \
  --output "$tmp/x" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "a split part of 0 is refused" contains "$tmp/err" "--split: every part must be >= 1"
check "no output after refused runs" test -z "$(ls "$tmp" | grep '^x\.')"

# It trains: the train part, its eval part held out.
vocab=$("$py" -c "import json; print(json.load(open('$tmp/all.json'))['vocab_size'])")
"$bin" train --set job.run_dir="$tmp/runs" --set training.dataset=megatron \
  --set training.dataset_path="$tmp/split-train" --set eval.dataset_path="$tmp/split-eval" \
  --set eval.batches=2 --set eval.interval=10 --set model.vocab_size="$vocab" \
  --set training.seq_len=32 --set training.batch_size=4 --set training.steps=20 \
  --set metrics.progress=off >"$tmp/train.out" 2>&1; rc=$?
check "moepeak train on the prepared data exits 0" test $rc -eq 0 || tail -5 "$tmp/train.out"
check "the run logs a held-out loss" grep -q 'eval_loss' "$tmp/runs/moepeak/metrics.jsonl"
check "the data line names the Megatron dataset" contains "$tmp/train.out" "Megatron indexed dataset"

report test_data_prepare
