"""S3 semantics of `kvtier gateway` that clients rely on, checked with boto3 and raw HTTP.

usage: s3_semantics.py ENDPOINT ACCESS SECRET MODE
MODE: semantics  - conditional requests, listings with control characters, retried
                   CompleteMultipartUpload, ignored Range headers, kept headers, refusals
      deleted    - PUT k "one", PUT k "two", DELETE k; a bucket deleted and created again
      deletedc   - after a restart: k is gone and unlisted, the re-created bucket is empty
Exit status 0 and a last line `OK` when every check passed.
"""
import datetime
import hashlib
import sys
import urllib.request

import boto3
import botocore
import botocore.handlers
import urllib.error
from botocore.config import Config

endpoint, access, secret, mode = sys.argv[1:5]


def client(key=access, sec=secret):
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=sec,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))


s3 = client()


def presigner():
    """A SigV4 presigning client that does not add encoding-type=url to listings."""
    c = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    c.meta.events.unregister("before-parameter-build.s3.ListObjectsV2",
                             botocore.handlers.set_list_objects_encoding_type_url)
    return c


def err(fn):
    try:
        fn()
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]
    return None


def body(r):
    return r["Body"].read()


def conditional():
    b = "cond"
    s3.create_bucket(Bucket=b)
    tag = s3.put_object(Bucket=b, Key="k", Body=b"one", IfNoneMatch="*")["ETag"]
    # Atomic create: a second create of the same key fails and changes nothing.
    assert err(lambda: s3.put_object(Bucket=b, Key="k", Body=b"two", IfNoneMatch="*")) == ("PreconditionFailed", 412)
    assert body(s3.get_object(Bucket=b, Key="k")) == b"one"
    # Safe overwrite: only with the current ETag.
    assert err(lambda: s3.put_object(Bucket=b, Key="k", Body=b"two", IfMatch='"0123"')) == ("PreconditionFailed", 412)
    assert body(s3.get_object(Bucket=b, Key="k")) == b"one"
    tag2 = s3.put_object(Bucket=b, Key="k", Body=b"two", IfMatch=tag)["ETag"]
    assert body(s3.get_object(Bucket=b, Key="k")) == b"two"
    assert err(lambda: s3.put_object(Bucket=b, Key="nokey", Body=b"x", IfMatch=tag)) == ("NoSuchKey", 404)
    # GET and HEAD conditions.
    assert err(lambda: s3.get_object(Bucket=b, Key="k", IfMatch=tag)) == ("PreconditionFailed", 412)
    assert body(s3.get_object(Bucket=b, Key="k", IfMatch=tag2)) == b"two"
    assert err(lambda: s3.get_object(Bucket=b, Key="k", IfNoneMatch=tag2))[1] == 304
    assert err(lambda: s3.head_object(Bucket=b, Key="k", IfNoneMatch=tag2))[1] == 304
    past = datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc)
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    assert body(s3.get_object(Bucket=b, Key="k", IfModifiedSince=past)) == b"two"
    assert err(lambda: s3.get_object(Bucket=b, Key="k", IfModifiedSince=future))[1] == 304
    assert err(lambda: s3.get_object(Bucket=b, Key="k", IfUnmodifiedSince=past)) == ("PreconditionFailed", 412)
    assert body(s3.get_object(Bucket=b, Key="k", IfUnmodifiedSince=future)) == b"two"
    # A write condition the gateway does not evaluate is refused, not ignored.
    def ims_put(**kw):
        kw["params"]["headers"]["If-Modified-Since"] = "Sat, 29 Oct 1994 19:43:31 GMT"
    c = client()
    c.meta.events.register("before-call.s3.PutObject", ims_put)
    assert err(lambda: c.put_object(Bucket=b, Key="k", Body=b"three")) == ("NotImplemented", 501)
    assert body(s3.get_object(Bucket=b, Key="k")) == b"two"


def listings():
    b = "ctl"
    s3.create_bucket(Bucket=b)
    keys = ["a\x01b", "plain", "cr\rkey", "sp ace+plus"]
    for k in keys:
        s3.put_object(Bucket=b, Key=k, Body=b"x")
    # boto3 asks for encoding-type=url and decodes: exact keys back.
    got = [o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]]
    assert got == sorted(keys), got
    got = [o["Key"] for o in s3.list_objects(Bucket=b)["Contents"]]
    assert got == sorted(keys), got
    # Without encoding: 200, and the control characters come as character references.
    url = presigner().generate_presigned_url("list_objects_v2", Params={"Bucket": b})
    with urllib.request.urlopen(url) as r:
        assert r.status == 200
        xml = r.read()
    assert b"a&#x1;b" in xml and b"cr&#xD;key" in xml and b"\x01" not in xml, xml
    r = s3.list_objects_v2(Bucket=b, Delimiter="", FetchOwner=True, ContinuationToken="")
    assert "Delimiter" not in r and r["ContinuationToken"] == "" and "Owner" in r["Contents"][0]
    # A key no client can send back as listed is refused, 400 not 404.
    assert err(lambda: s3.get_object(Bucket=b, Key="\xae\x8a-"))[1] == 400
    assert err(lambda: s3.put_object(Bucket=b, Key="x" * 1025, Body=b""))[1] == 400


def multipart_and_ranges():
    b = "mpu"
    s3.create_bucket(Bucket=b)
    up = s3.create_multipart_upload(Bucket=b, Key="m", CacheControl="max-age=60")["UploadId"]
    p1 = s3.upload_part(Bucket=b, Key="m", UploadId=up, PartNumber=1, Body=b"a" * (5 << 20))["ETag"]
    p2 = s3.upload_part(Bucket=b, Key="m", UploadId=up, PartNumber=2, Body=b"tail")["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": p1}, {"PartNumber": 2, "ETag": p2}]}
    first = s3.complete_multipart_upload(Bucket=b, Key="m", UploadId=up, MultipartUpload=parts)
    again = s3.complete_multipart_upload(Bucket=b, Key="m", UploadId=up, MultipartUpload=parts)
    assert first["ETag"] == again["ETag"] and first["ETag"].endswith('-2"'), (first, again)
    r = s3.get_object(Bucket=b, Key="m", Range="bytes=5242878-")
    assert body(r) == b"aatail" and r["CacheControl"] == "max-age=60"
    # Invalid and multi-range headers: the whole object, 200, as S3 answers.
    s3.put_object(Bucket=b, Key="r", Body=b"0123456789", ContentDisposition="inline", ContentLanguage="de",
                  ContentEncoding="identity", Expires=datetime.datetime(2030, 1, 1))
    # (Sent unsigned, on a presigned URL: a signature covering the header forbids dropping it.)
    url = presigner().generate_presigned_url("get_object", Params={"Bucket": b, "Key": "r"})
    for rng in ["bytes=5-2", "bytes=0-1,4-5", "bytes=x-y", "lines=1-2"]:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": rng})) as r:
            assert r.status == 200 and r.read() == b"0123456789", rng
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=2-3"})) as r:
        assert r.status == 206 and r.read() == b"23"
    # The same headers signed (boto3 signs Range): still the whole object, after the
    # signature was checked; a wrong secret is still refused, a condition still applies.
    for rng in ["bytes=5-2", "bytes=0-1,4-5", "bytes=x-y", "lines=1-2"]:
        r = s3.get_object(Bucket=b, Key="r", Range=rng)
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 200 and body(r) == b"0123456789", rng
        assert "ContentRange" not in r and r["ContentLanguage"] == "de", (rng, r)
        h = s3.head_object(Bucket=b, Key="r", Range=rng)
        assert h["ResponseMetadata"]["HTTPStatusCode"] == 200 and h["ContentLength"] == 10, (rng, h)
        assert err(lambda: client(sec="wrong").get_object(Bucket=b, Key="r", Range=rng))[1] == 403
        assert err(lambda: s3.get_object(Bucket=b, Key="r", Range=rng, IfMatch='"nope"'))[1] == 412
        assert err(lambda: s3.get_object(Bucket=b, Key="absent", Range=rng))[0] == "NoSuchKey"
    # A presigned URL whose signature covers the Range header (X-Amz-SignedHeaders=host;range).
    signed = presigner().generate_presigned_url("get_object", Params={"Bucket": b, "Key": "r", "Range": "bytes=0-1,4-5"})
    assert "range" in signed, signed
    with urllib.request.urlopen(urllib.request.Request(signed, headers={"Range": "bytes=0-1,4-5"})) as r:
        assert r.status == 200 and r.read() == b"0123456789"
    # Without a signature (anonymous), the object is private: refused whatever the Range.
    anon = urllib.request.Request(f"{endpoint}/{b}/r", headers={"Range": "bytes=5-2"})
    try:
        urllib.request.urlopen(anon)
        raise AssertionError("an anonymous GET of a private object was served")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    assert err(lambda: s3.get_object(Bucket=b, Key="r", Range="bytes=10-"))[1] == 416
    h = s3.head_object(Bucket=b, Key="r")
    assert (h["ContentDisposition"], h["ContentLanguage"], h["ContentEncoding"]) == ("inline", "de", "identity"), h
    assert h["Expires"].year == 2030


def refusals():
    b = "mpu"
    assert err(lambda: client(key="nobody").list_buckets())[0] == "InvalidAccessKeyId"
    # Names no client could address, refused by CreateBucket as by --create-bucket.
    for name in ("xn--bad", "a..b", "192.168.5.4", "bad-s3alias", "ab", "a.-b"):
        got = err(lambda: s3.create_bucket(Bucket=name))
        assert got[0] == "InvalidBucketName", (name, got)
    c = client()
    c.meta.events.register("before-call.s3.PutObject",
                           lambda **kw: kw["params"]["headers"].update({"Content-MD5": ""}))
    got = err(lambda: c.put_object(Bucket=b, Key="md", Body=b"x"))
    assert got == ("InvalidDigest", 400), got
    assert err(lambda: s3.put_object(Bucket=b, Key="md", Body=b"x", Metadata={"big": "v" * 2100}))[0] == "MetadataTooLarge"
    url = presigner().generate_presigned_url("get_object", Params={"Bucket": b, "Key": "r"}, ExpiresIn=8 * 24 * 3600)
    try:
        urllib.request.urlopen(url)
        raise AssertionError("a presigned URL valid for 8 days was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 403


def deleted():
    s3.create_bucket(Bucket="res")
    s3.put_object(Bucket="res", Key="k", Body=b"one")
    s3.put_object(Bucket="res", Key="k", Body=b"two")
    s3.delete_object(Bucket="res", Key="k")
    s3.create_bucket(Bucket="again")
    s3.put_object(Bucket="again", Key="old", Body=b"old")
    s3.put_object(Bucket="again", Key="old", Body=b"older")
    s3.delete_object(Bucket="again", Key="old")
    s3.delete_bucket(Bucket="again")
    s3.create_bucket(Bucket="again")
    deletedc()


def deletedc():
    assert err(lambda: s3.get_object(Bucket="res", Key="k")) == ("NoSuchKey", 404)
    assert s3.list_objects_v2(Bucket="res").get("KeyCount") == 0
    assert s3.list_objects_v2(Bucket="again").get("KeyCount") == 0
    assert err(lambda: s3.get_object(Bucket="again", Key="old")) == ("NoSuchKey", 404)


if mode == "semantics":
    conditional()
    listings()
    multipart_and_ranges()
    refusals()
elif mode == "deleted":
    deleted()
elif mode == "deletedc":
    deletedc()
else:
    sys.exit("unknown mode " + mode)
print("OK")
