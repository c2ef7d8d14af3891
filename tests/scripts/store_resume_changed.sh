#!/usr/bin/env bash
# A GET cut short is resumed (Range from what was kept, If-Match on its
# ETag); when the object was replaced meanwhile by a shorter one, a store
# that ignores If-Match on GET (s3rver 3.7) answers 416, not 412.  The GET
# must start over and return the new object, as after a 412 (it failed with
# FERRY_ERR_STORE_RANGE: shard_s3.sh under ASan, an island reading a HEAD
# rewritten shorter between two attempts).  Strict server: cut_shrink cuts
# the answer half way and then replaces the object by its first eighth.
set -u
TEST_NAME=store_resume_changed
source tests/tools/store_env.sh

store_built || skip_all "store not built (NO_NET=1?)"
KEY=AKIARESUME
SECRET=resume-secret
start_strict "$KEY" "$SECRET"
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_DEFAULT_REGION
export AWS_REGION=us-east-1
S="tool --endpoint $EP --access-key $KEY --secret-key $SECRET --retry-base-ms 20 --deadline-ms 20000"

head -c 65536 /dev/urandom >"$WORK/obj"
head -c 8192 "$WORK/obj" >"$WORK/short"
$S s3://bkt put k/obj "$WORK/obj" >/dev/null
check "a GET cut short and resumed, the object unchanged: the whole object" bash -c \
    "curl -s '$EP/__ctl?cut=1' >/dev/null && $S s3://bkt get k/obj '$WORK/got1' && cmp -s '$WORK/obj' '$WORK/got1'"

# S3's way: the resume's If-Match fails (412), the GET starts over
$S s3://bkt put k/obj "$WORK/obj" >/dev/null
strict_ctl "cut_shrink=1"
$S s3://bkt get k/obj "$WORK/got2" 2>"$WORK/err2"
rc=$?
check "object shortened between attempts, If-Match honoured (412): the new object (exit $rc)" cmp -s "$WORK/short" "$WORK/got2"

# s3rver's way: If-Match ignored, the resume past the new end is 416
$S s3://bkt put k/obj "$WORK/obj" >/dev/null
strict_ctl "cut_shrink=1&no_get_if_match=1"
$S s3://bkt get k/obj "$WORK/got3" 2>"$WORK/err3"
rc=$?
sed 's/^/    | /' "$WORK/err3" | head -3
check "object shortened between attempts, If-Match ignored (416): the new object (exit $rc)" cmp -s "$WORK/short" "$WORK/got3"
finish
