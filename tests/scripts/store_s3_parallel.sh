#!/usr/bin/env bash
# Transfers that fill long links, against tests/tools/s3_strict_server.py:
# multipart uploads with several parts in flight (upload_concurrency),
# each part retried alone, the whole upload aborted when one part fails
# for good (the old object stays, no upload is left open), and parallel
# ranged downloads (ferry_store_get_file_parallel).  The server counts the
# UploadPart requests it handles at once; each part is held 300 ms there so
# that overlap, if any, shows.
set -u
TEST_NAME=store_s3_parallel
source tests/tools/store_env.sh

[ -x "$STORE_TOOL" ] || { echo "missing $STORE_TOOL (make tests)"; echo "0 passed, 1 failed"; exit 1; }
store_built || skip_all "store layer not built (NO_NET=1)"
KEY=AKIAFERRYTEST
SECRET=ferry-parallel-secret
start_strict "$KEY" "$SECRET"
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3
S="tool --endpoint $EP --access-key $KEY --secret-key $SECRET --retry-base-ms 20 --deadline-ms 20000 --part-size 262144"

head -c 3000000 /dev/urandom >"$WORK/big"   # 12 parts of 256 KiB (the last one shorter)
# progress_whole FILE: "progress DONE TOTAL" lines whose totals are all the
# object's size and whose last line is all of it
progress_whole() {
    awk '$3 != 3000000 {bad = 1} END {exit bad}' "$1" && tail -n 1 "$1" | grep -qx 'progress 3000000 3000000'
}
head -c 1000000 /dev/urandom >"$WORK/old"

# --- parts in flight at once, assembled in order ------------------------------
strict_ctl "reset=1&part_delay=300"
t0=$(date +%s%N)
$S --upload-conc 4 s3://bkt put p/big "$WORK/big" >/dev/null
rc=$?
ms4=$((($(date +%s%N) - t0) / 1000000))
check "12-part upload, 4 at once: succeeds" [ $rc -eq 0 ]
inflight=$(strict_stat parts_in_flight_max)
echo "    most UploadPart requests in flight at once: $inflight (concurrency 4), upload took $ms4 ms"
check "the server saw 3 or 4 parts in flight at once, never more than 4" [ "$inflight" -ge 3 -a "$inflight" -le 4 ]
check "each part sent once" [ "$(strict_stat upload_parts)" = 12 ]
$S s3://bkt get p/big "$WORK/big.back"
check "the object round-trips byte for byte" cmp -s "$WORK/big" "$WORK/big.back"

strict_ctl "reset=1&part_delay=300"
t0=$(date +%s%N)
$S --upload-conc 1 s3://bkt put p/big1 "$WORK/big" >/dev/null
ms1=$((($(date +%s%N) - t0) / 1000000))
echo "    concurrency 1: $ms1 ms (each part held 300 ms by the server)"
check "concurrency 1: one part at a time" [ "$(strict_stat parts_in_flight_max)" = 1 ]
check "concurrency 4 is faster than 1 (parts held 300 ms each)" [ "$ms4" -lt $((ms1 * 2 / 3)) ]
$S s3://bkt get p/big1 "$WORK/big1.back"
check "concurrency 1: same bytes" cmp -s "$WORK/big" "$WORK/big1.back"
check "both uploads carry S3's multipart etag" bash -c "[ \"\$($S s3://bkt head p/big | cut -d' ' -f2)\" = \"\$($S s3://bkt head p/big1 | cut -d' ' -f2)\" ] && $S s3://bkt head p/big | grep -q -- '-12 '"

$S --upload-conc 4 --progress s3://bkt put p/prog "$WORK/big" >/dev/null 2>"$WORK/put.progress"
check "upload progress is the sum over the parts (totals the object's size, the last line all of it)" \
    progress_whole "$WORK/put.progress"

# --- a part that fails once (503) is retried alone -------------------------------
strict_ctl "reset=1&part_delay=0&fail_part=7"
check "a part answered 503 once: the upload completes" bash -c "$S --upload-conc 4 s3://bkt put p/retry '$WORK/big' >/dev/null"
check "only that part was sent again (13 UploadPart requests for 12 parts)" [ "$(strict_stat upload_parts)" = 13 ]
$S s3://bkt get p/retry "$WORK/retry.back"
check "and the object is whole" cmp -s "$WORK/big" "$WORK/retry.back"

# --- a part that fails for good aborts the whole upload -------------------------
$S s3://bkt put p/victim "$WORK/old" >/dev/null
old_etag=$($S s3://bkt head p/victim | cut -d' ' -f2)
strict_ctl "reset=1&part_delay=100&bad_part=5"
$S --upload-conc 4 s3://bkt put p/victim "$WORK/big" >/dev/null 2>"$WORK/bad.err"
rc=$?
sed 's/^/    /' "$WORK/bad.err"
check "part 5 refused (400): the put fails with FERRY_ERR_STORE_HTTP (66)" [ $rc -eq 66 ]
check "the message names part 5 and the server's error" grep -q 'UploadPart 5/12: HTTP 400 InvalidArgument' "$WORK/bad.err"
check "the upload was aborted" [ "$(strict_stat aborts)" = 1 ]
check "no upload is left open on the server" [ "$(strict_stat uploads)" = 0 ]
check "the parts after the failure were not all sent (the others stopped)" [ "$(strict_stat upload_parts)" -lt 12 ]
check "the old object is still there, unchanged" bash -c "[ \"\$($S s3://bkt head p/victim | cut -d' ' -f2)\" = '$old_etag' ]"
$S s3://bkt get p/victim "$WORK/victim.back"
check "byte for byte" cmp -s "$WORK/old" "$WORK/victim.back"
strict_ctl "reset=1&part_delay=0&bad_part=12"
check_rc "the last part refused, on a new key: exit 66" 66 $S --upload-conc 4 s3://bkt put p/never "$WORK/big" 2>/dev/null
check_rc "and no object appeared (404 -> 62)" 62 $S s3://bkt head p/never 2>/dev/null
check "no upload left open" [ "$(strict_stat uploads)" = 0 ]

# --- options ------------------------------------------------------------------
check_rc "upload_concurrency above 64 is refused (60)" 60 $S --upload-conc 65 s3://bkt put p/x "$WORK/old" 2>/dev/null

# --- parallel ranged downloads ----------------------------------------------------
strict_ctl "reset=1"
check "get_file_parallel, 4 streams of 256 KiB chunks" $S --conc 4 --chunk 262144 s3://bkt pgetfile p/big "$WORK/pget"
check "same bytes" cmp -s "$WORK/big" "$WORK/pget"
check "every byte came through ranged GETs, once" [ "$(strict_stat range_bytes)" = 3000000 ]
check "nothing but the object is left beside it" bash -c "[ \$(ls '$WORK' | grep -c '^pget') = 1 ]"
$S --conc 4 --chunk 262144 --rate 2000000 --progress s3://bkt pgetfile p/big "$WORK/pget2" 2>"$WORK/pget.progress"
check "with a progress callback: same bytes" cmp -s "$WORK/big" "$WORK/pget2"
check "progress is the sum over the chunks: every total is the object's size, the last line is all of it" \
    progress_whole "$WORK/pget.progress"
check "and it grows past one chunk (not per chunk)" bash -c "awk '\$2 > 262144 {n++} END {exit !(n > 0)}' '$WORK/pget.progress'"
# two downloads into the same file at once: the second is refused (63)
# without touching the first one's PATH.part, which completes
$S --conc 2 --chunk 262144 --rate 500000 --resume s3://bkt pgetfile p/big "$WORK/twice" &
first=$!
wait_for_file() { for ((i = 0; i < 100; i++)); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
wait_for_file "$WORK/twice.part.state"
check_rc "a second download into the same PATH meanwhile: refused (63)" 63 \
    $S --conc 2 --chunk 262144 --resume s3://bkt pgetfile p/big "$WORK/twice" 2>"$WORK/twice.err"
check "the message says another download is in progress" grep -q 'another download into this file is in progress' "$WORK/twice.err"
wait "$first"
check "the first one completes, whole" cmp -s "$WORK/big" "$WORK/twice"
check "and nothing is left beside it" bash -c "[ \$(ls '$WORK' | grep -c '^twice\.part') = 0 ]"

finish
