#!/usr/bin/env bash
# `moepeak data prepare` with a tokenizer.json, from a model directory as downloaded: the ids of
# every document are Hugging Face tokenizers' own (the committed fixtures' cases,
# tests/data/tokenizers: DeepSeek-V3's kind, whose template puts BOS in front) then the EOS that
# tokenizer_config.json names; --bos does not double the template's BOS; --eos overrides; a
# directory whose files name no EOS is refused unless --eos or --no-eos; the same bytes on 1 and 2
# worker threads and tiny chunks; invalid UTF-8 is an error naming the file and line; a
# tokenizer.json with a part moepeak does not implement is an error naming the field, with
# nothing written.
# Run: ctest -R test_data_prepare_hf   (or: bash tests/cli/test_data_prepare_hf.sh build/moepeak)
set -u
bin="$1"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fixtures="$here/../data/tokenizers"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/shell_checks.sh
source "$here/../shell_checks.sh"  # check, contains, report
py=/usr/bin/python3  # Debian's, with python3-numpy

# A model directory: tokenizer.json, tokenizer_config.json (EOS by name), config.json.
mkdir -p "$tmp/model"
cp "$fixtures/deepseek_v3/tokenizer.json" "$tmp/model/"
"$py" - "$tmp" "$fixtures/deepseek_v3/cases.jsonl" <<'PY'
import json, sys
tmp, cases = sys.argv[1], sys.argv[2]
json.dump({"eos_token": {"content": "<｜end▁of▁sentence｜>"},
           "bos_token": {"content": "<｜begin▁of▁sentence｜>"}},
          open(f"{tmp}/model/tokenizer_config.json", "w"), ensure_ascii=False)
# config.json names another id: tokenizer_config.json's name wins.
json.dump({"model_type": "deepseek_v3", "eos_token_id": 7}, open(f"{tmp}/model/config.json", "w"))
docs = [json.loads(l) for l in open(cases, encoding="utf-8") if l.strip()]
docs = [d for d in docs if d["text"]]  # the reader skips empty documents
with open(f"{tmp}/docs.jsonl", "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d["text"]}, ensure_ascii=False) + "\n")
json.dump(docs, open(f"{tmp}/expected.json", "w"), ensure_ascii=False)
PY

"$bin" data prepare --tokenizer "$tmp/model" --input "$tmp/docs.jsonl" --output "$tmp/all" \
  --workers 2 --json "$tmp/all.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "prepare from the model directory exits 0" test $rc -eq 0 || cat "$tmp/err"
check "the table names the tokenizer.json" contains "$tmp/out" "$tmp/model/tokenizer.json (tokenizer.json)"

cat >"$tmp/verify.py" <<'PY'
import json, sys
import numpy as np
tmp, prefix, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def read(prefix):
    idx = open(prefix + ".idx", "rb").read()
    code = idx[17]
    S = int.from_bytes(idx[18:26], "little")
    lengths = np.frombuffer(idx, np.int32, S, 34)
    pointers = np.frombuffer(idx, np.int64, S, 34 + 4 * S)
    dtype = {8: np.uint16, 4: np.int32}[code]
    bin_ = np.fromfile(prefix + ".bin", dtype)
    return [bin_[p // dtype().itemsize: p // dtype().itemsize + n].tolist()
            for p, n in zip(pointers, lengths)]
docs = json.load(open(f"{tmp}/expected.json", encoding="utf-8"))
summary = json.load(open(f"{tmp}/all.json"))
eos = summary["eos_id"]
got = read(prefix)
assert len(got) == len(docs), (len(got), len(docs))
for i, (g, d) in enumerate(zip(got, docs)):
    want = list(d["ids"]) if mode == "eos" else list(d["ids"])
    if mode == "eos" and (not want or want[-1] != eos):
        want.append(eos)
    assert g == want, f"document {i} ({d['name']}): {g[:12]} != {want[:12]}"
print("verified", len(got), "documents; EOS", eos)
PY
"$py" "$tmp/verify.py" "$tmp" "$tmp/all" eos >"$tmp/verify.out" 2>&1; rc=$?
check "ids are tokenizers' (BOS from the template) + tokenizer_config.json's EOS" test $rc -eq 0 ||
  cat "$tmp/verify.out"
eos_named=$("$py" -c "import json,sys; t=json.load(open(sys.argv[1], encoding='utf-8')); print(next(a['id'] for a in t['added_tokens'] if a['content'] == '<｜end▁of▁sentence｜>'))" "$tmp/model/tokenizer.json")
check "the summary's EOS is tokenizer_config.json's, not config.json's" contains "$tmp/all.json" "\"eos_id\": $eos_named"


# --bos: the template already begins with BOS, so the bytes do not change.
"$bin" data prepare --tokenizer "$tmp/model" --input "$tmp/docs.jsonl" --output "$tmp/bos" \
  --bos >/dev/null 2>"$tmp/err"
check "--bos does not double the template's BOS" cmp "$tmp/bos.bin" "$tmp/all.bin"
# One worker, 64-byte chunks: the same bytes.
"$bin" data prepare --tokenizer "$tmp/model/tokenizer.json" --input "$tmp/docs.jsonl" \
  --output "$tmp/one" --workers 1 --chunk-size 64 >/dev/null 2>&1
check "the file itself, 1 worker, 64-byte chunks: the same .bin" cmp "$tmp/one.bin" "$tmp/all.bin"
check "... and .idx" cmp "$tmp/one.idx" "$tmp/all.idx"

# No file names an EOS: refused, unless --eos names it or --no-eos drops it.
mkdir -p "$tmp/bare"
cp "$fixtures/qwen3/tokenizer.json" "$tmp/bare/"
"$bin" data prepare --tokenizer "$tmp/bare" --input "$tmp/docs.jsonl" --output "$tmp/x" \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "no EOS anywhere exits 1" test $rc -eq 1
check "... saying how to name one" contains "$tmp/err" "--eos TOKEN names it"
"$bin" data prepare --tokenizer "$tmp/bare" --input "$tmp/docs.jsonl" --output "$tmp/named" \
  --eos '<|endoftext|>' --json "$tmp/named.json" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "--eos names it" test $rc -eq 0 || cat "$tmp/err"
endoftext=$("$py" -c "import json,sys; t=json.load(open(sys.argv[1], encoding='utf-8')); print(next(a['id'] for a in t['added_tokens'] if a['content'] == '<|endoftext|>'))" "$tmp/bare/tokenizer.json")
check "... its id in the summary" contains "$tmp/named.json" "\"eos_id\": $endoftext"

"$bin" data prepare --tokenizer "$tmp/bare" --input "$tmp/docs.jsonl" --output "$tmp/x" \
  --eos '<|nope|>' >"$tmp/out" 2>"$tmp/err"; rc=$?
check "an --eos that is no token exits 1" contains "$tmp/err" "--eos \"<|nope|>\" is not a token of"

# Invalid UTF-8 in a text file: the file and line.
printf 'good text\n\nbad \xC3\x28 text\n' >"$tmp/bad.txt"
"$bin" data prepare --tokenizer "$tmp/model" --input "$tmp/bad.txt" --output "$tmp/x" \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "invalid UTF-8 exits 1" test $rc -eq 1
check "... naming the file, line and byte" contains "$tmp/err" "$tmp/bad.txt:3: not valid UTF-8 (byte 0xC3 at column 5)"
printf '{"text": "bad \xC3\x28"}\n' >"$tmp/bad.jsonl"
"$bin" data prepare --tokenizer "$tmp/model" --input "$tmp/bad.jsonl" --output "$tmp/x" \
  >"$tmp/out" 2>"$tmp/err"; rc=$?
check "invalid UTF-8 in JSONL names the line" contains "$tmp/err" "$tmp/bad.jsonl:1: not a JSON line"

# A part moepeak does not implement: the field, exit 1, nothing written.
mkdir -p "$tmp/odd"
"$py" - "$fixtures/gpt2/tokenizer.json" "$tmp/odd/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Punctuation", "behavior": "Isolated"}]}
json.dump(j, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
"$bin" data prepare --tokenizer "$tmp/odd" --input "$tmp/docs.jsonl" --output "$tmp/odd_out" \
  --no-eos >"$tmp/out" 2>"$tmp/err"; rc=$?
check "an unimplemented pre-tokenizer exits 1" test $rc -eq 1
check "... naming the field" contains "$tmp/err" 'field "pre_tokenizer.pretokenizers[0].type" is "Punctuation"'
check "nothing written after refused runs" test -z "$(ls "$tmp" | grep '^\(x\|odd_out\)\.')"

report test_data_prepare_hf
