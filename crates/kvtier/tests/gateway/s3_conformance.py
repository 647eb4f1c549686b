"""S3 behaviour of `kvtier gateway` measured by ceph/s3-tests, checked with boto3.

usage: s3_conformance.py ENDPOINT ACCESS SECRET MODE
MODE: api     - x-amz-request-id on answers and in error bodies, re-creating an owned
                bucket, GET/HEAD by partNumber, GetObjectAttributes, ListMultipartUploads,
                canned ACLs, anonymous reads and the ACL operations, CORS preflights,
                GetBucketLocation, ListBuckets pages
      parts   - a multipart object, a single-PUT object, public-read objects and a bucket
                with a location constraint, for `partsc`
      partsc  - after a restart: part boundaries, ACLs and the location are still known
Exit status 0 and a last line `OK` when every check passed.
"""
import hashlib
import sys
import xml.etree.ElementTree as ET

import urllib.error
import urllib.request

import boto3
import botocore
from botocore import UNSIGNED
from botocore.config import Config

endpoint, access, secret, mode = sys.argv[1:5]

s3 = boto3.client(
    "s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
    region_name="us-east-1",
    config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))

MIB = 1 << 20


def err(fn):
    try:
        fn()
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]
    return None


def data(i, size):
    seed = hashlib.sha256(b"part%d" % i).digest()
    return (seed * (size // 32 + 1))[:size]


SIZES = [5 * MIB, 5 * MIB + 3, 1000]


def request_ids():
    b = "reqid"
    s3.create_bucket(Bucket=b)
    seen = {}

    def keep(http_response, **kw):
        seen["body"] = http_response.content
        seen["id"] = http_response.headers.get("x-amz-request-id")

    c = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))
    c.meta.events.register("after-call.s3.GetObject", keep)
    try:
        c.get_object(Bucket=b, Key="missing")
        raise AssertionError("a missing key was found")
    except botocore.exceptions.ClientError as e:
        header_id = e.response["ResponseMetadata"]["RequestId"]
    body_id = ET.fromstring(seen["body"]).find("RequestId").text
    assert header_id and header_id == body_id == seen["id"], (header_id, body_id, seen)
    # Successes carry one too, and ids differ between requests.
    ok = s3.head_bucket(Bucket=b)["ResponseMetadata"]["RequestId"]
    assert ok and ok != header_id, (ok, header_id)
    # A HEAD error has no body, only the header.
    e = None
    try:
        s3.head_object(Bucket=b, Key="missing")
    except botocore.exceptions.ClientError as x:
        e = x
    assert e.response["ResponseMetadata"]["RequestId"], e.response


def recreate():
    b = "again"
    s3.create_bucket(Bucket=b)
    s3.put_object(Bucket=b, Key="k1", Body=b"one")
    s3.put_object(Bucket=b, Key="k2", Body=b"two")
    r = s3.create_bucket(Bucket=b)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200, r
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]]
    assert keys == ["k1", "k2"], keys
    assert s3.get_object(Bucket=b, Key="k1")["Body"].read() == b"one"


def make_parts():
    b = "parts"
    s3.create_bucket(Bucket=b)
    up = s3.create_multipart_upload(Bucket=b, Key="mp")["UploadId"]
    parts = []
    for i, size in enumerate(SIZES, 1):
        tag = s3.upload_part(Bucket=b, Key="mp", UploadId=up, PartNumber=i, Body=data(i, size))["ETag"]
        parts.append({"PartNumber": i, "ETag": tag})
    # Before completion there is no object to take a part of.
    assert err(lambda: s3.get_object(Bucket=b, Key="mp", PartNumber=1)) == ("NoSuchKey", 404)
    s3.complete_multipart_upload(Bucket=b, Key="mp", UploadId=up, MultipartUpload={"Parts": parts})
    s3.put_object(Bucket=b, Key="single", Body=b"just one part")


def check_parts():
    b = "parts"
    etag = s3.head_object(Bucket=b, Key="mp")["ETag"]
    assert etag.endswith('-3"'), etag
    start = 0
    for i, size in enumerate(SIZES, 1):
        h = s3.head_object(Bucket=b, Key="mp", PartNumber=i)
        assert (h["PartsCount"], h["ContentLength"], h["ETag"]) == (3, size, etag), h
        g = s3.get_object(Bucket=b, Key="mp", PartNumber=i)
        assert g["ResponseMetadata"]["HTTPStatusCode"] == 206, g["ResponseMetadata"]
        assert g["PartsCount"] == 3 and g["ContentLength"] == size, g
        assert g["ContentRange"] == "bytes %d-%d/%d" % (start, start + size - 1, sum(SIZES)), g["ContentRange"]
        assert g["Body"].read() == data(i, size), i
        start += size
    assert err(lambda: s3.get_object(Bucket=b, Key="mp", PartNumber=4)) == ("InvalidPart", 400)
    assert err(lambda: s3.head_object(Bucket=b, Key="mp", PartNumber=4))[1] == 400
    assert err(lambda: s3.get_object(Bucket=b, Key="mp", PartNumber=10001))[1] == 400
    assert err(lambda: s3.get_object(Bucket=b, Key="mp", PartNumber=1, Range="bytes=0-1")) == ("InvalidRequest", 400)
    # An object from a single PUT is one part.
    g = s3.get_object(Bucket=b, Key="single", PartNumber=1)
    assert g["Body"].read() == b"just one part" and "PartsCount" not in g, g
    assert err(lambda: s3.get_object(Bucket=b, Key="single", PartNumber=2)) == ("InvalidPart", 400)
    # GetObjectAttributes: an unquoted ETag, the size, the parts (paged).
    want = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]
    a = s3.get_object_attributes(Bucket=b, Key="mp", ObjectAttributes=want)
    assert a["ETag"] == etag.strip('"') and a["ObjectSize"] == sum(SIZES), a
    assert a["StorageClass"] == "STANDARD" and "Checksum" not in a, a
    p = a["ObjectParts"]
    assert p.get("TotalPartsCount", p.get("PartsCount")) == 3 and p["IsTruncated"] is False, p
    assert [(x["PartNumber"], x["Size"]) for x in p["Parts"]] == [(1, SIZES[0]), (2, SIZES[1]), (3, SIZES[2])], p
    p = s3.get_object_attributes(Bucket=b, Key="mp", ObjectAttributes=want, MaxParts=1, PartNumberMarker=1)["ObjectParts"]
    assert p["IsTruncated"] is True and p["NextPartNumberMarker"] == 2 and p["PartNumberMarker"] == 1, p
    assert [(x["PartNumber"], x["Size"]) for x in p["Parts"]] == [(2, SIZES[1])], p
    a = s3.get_object_attributes(Bucket=b, Key="single", ObjectAttributes=["ObjectSize", "ETag"])
    assert a["ObjectSize"] == 13 and "ObjectParts" not in a and "StorageClass" not in a, a
    assert err(lambda: s3.get_object_attributes(Bucket=b, Key="nope", ObjectAttributes=["ETag"])) == ("NoSuchKey", 404)


def list_uploads():
    b = "uploads"
    s3.create_bucket(Bucket=b)
    ids = {}
    for key in ["a/1", "a/2", "b", "b", "c/x/y"]:
        ids.setdefault(key, []).append(s3.create_multipart_upload(Bucket=b, Key=key)["UploadId"])
    r = s3.list_multipart_uploads(Bucket=b)
    got = [(u["Key"], u["UploadId"]) for u in r["Uploads"]]
    want = [("a/1", ids["a/1"][0]), ("a/2", ids["a/2"][0]), ("b", ids["b"][0]), ("b", ids["b"][1]),
            ("c/x/y", ids["c/x/y"][0])]
    assert got == want and r["IsTruncated"] is False, (got, want)
    assert r["Uploads"][0]["Owner"]["ID"] and r["Uploads"][0]["Initiated"], r["Uploads"][0]
    # Pages of two, by key then initiation, resumed from the markers.
    seen, kw = [], {}
    while True:
        r = s3.list_multipart_uploads(Bucket=b, MaxUploads=2, **kw)
        seen += [(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])]
        if not r["IsTruncated"]:
            break
        kw = {"KeyMarker": r["NextKeyMarker"], "UploadIdMarker": r["NextUploadIdMarker"]}
    assert seen == want, seen
    r = s3.list_multipart_uploads(Bucket=b, Prefix="a/")
    assert [u["Key"] for u in r["Uploads"]] == ["a/1", "a/2"], r
    r = s3.list_multipart_uploads(Bucket=b, Delimiter="/")
    assert [u["Key"] for u in r["Uploads"]] == ["b", "b"], r
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/", "c/"], r
    s3.abort_multipart_upload(Bucket=b, Key="b", UploadId=ids["b"][0])
    r = s3.list_multipart_uploads(Bucket=b, Prefix="b")
    assert [u["UploadId"] for u in r["Uploads"]] == [ids["b"][1]], r
    assert err(lambda: s3.list_multipart_uploads(Bucket="nosuchbucket")) == ("NoSuchBucket", 404)


anon = boto3.client(
    "s3", endpoint_url=endpoint, region_name="us-east-1",
    config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}, s3={"addressing_style": "path"}))


def make_public():
    s3.create_bucket(Bucket="pub", ACL="public-read")
    s3.put_object(Bucket="pub", Key="open", Body=b"for everyone", ACL="public-read")
    s3.put_object(Bucket="pub", Key="closed", Body=b"owner only")
    s3.create_bucket(Bucket="priv")
    s3.put_object(Bucket="priv", Key="open", Body=b"open in private", ACL="public-read")
    s3.put_object(Bucket="priv", Key="closed", Body=b"owner only", ACL="private")
    up = s3.create_multipart_upload(Bucket="priv", Key="mp-open", ACL="public-read")["UploadId"]
    tag = s3.upload_part(Bucket="priv", Key="mp-open", UploadId=up, PartNumber=1, Body=b"mp")["ETag"]
    s3.complete_multipart_upload(Bucket="priv", Key="mp-open", UploadId=up,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": tag}]})
    s3.create_bucket(Bucket="located", CreateBucketConfiguration={"LocationConstraint": "default"})


def check_public():
    # Anonymous reads of objects written public-read, in any bucket.
    assert anon.get_object(Bucket="pub", Key="open")["Body"].read() == b"for everyone"
    assert anon.head_object(Bucket="pub", Key="open")["ContentLength"] == 12
    assert anon.get_object(Bucket="priv", Key="open")["Body"].read() == b"open in private"
    assert anon.get_object(Bucket="priv", Key="mp-open")["Body"].read() == b"mp"
    # Nothing else: private objects, listings, writes, deletes, other operations.
    assert err(lambda: anon.get_object(Bucket="pub", Key="closed")) == ("AccessDenied", 403)
    assert err(lambda: anon.get_object(Bucket="priv", Key="closed")) == ("AccessDenied", 403)
    assert err(lambda: anon.head_object(Bucket="priv", Key="closed"))[1] == 403
    assert err(lambda: anon.get_object_attributes(Bucket="pub", Key="open", ObjectAttributes=["ETag"]))[1] == 403
    assert err(lambda: anon.list_objects_v2(Bucket="pub")) == ("AccessDenied", 403)
    assert err(lambda: anon.list_objects(Bucket="pub")) == ("AccessDenied", 403)
    assert err(lambda: anon.list_buckets()) == ("AccessDenied", 403)
    assert err(lambda: anon.put_object(Bucket="pub", Key="open", Body=b"defaced")) == ("AccessDenied", 403)
    assert err(lambda: anon.delete_object(Bucket="pub", Key="open")) == ("AccessDenied", 403)
    assert err(lambda: anon.create_multipart_upload(Bucket="pub", Key="x")) == ("AccessDenied", 403)
    assert err(lambda: anon.delete_bucket(Bucket="priv")) == ("AccessDenied", 403)
    assert s3.get_object(Bucket="pub", Key="open")["Body"].read() == b"for everyone"
    # A missing key: 404 where the bucket is public-read, 403 where it is not (no
    # probing for names); a missing bucket is 404 whoever asks, as in S3.
    assert err(lambda: anon.get_object(Bucket="pub", Key="nothing")) == ("NoSuchKey", 404)
    assert err(lambda: anon.get_object(Bucket="priv", Key="nothing")) == ("AccessDenied", 403)
    assert err(lambda: anon.get_object(Bucket="gone-bucket", Key="x")) == ("NoSuchBucket", 404)
    assert err(lambda: anon.delete_object(Bucket="gone-bucket", Key="x")) == ("NoSuchBucket", 404)
    assert s3.get_bucket_location(Bucket="located")["LocationConstraint"] == "default"


def acls_and_more():
    make_public()
    check_public()
    # The ACL belongs to the object written: a private overwrite closes it.
    s3.put_object(Bucket="priv", Key="open", Body=b"now private")
    assert err(lambda: anon.get_object(Bucket="priv", Key="open")) == ("AccessDenied", 403)
    # What would let others write, and explicit grants, are refused, not ignored.
    assert err(lambda: s3.put_object(Bucket="pub", Key="w", Body=b"x", ACL="public-read-write")) == ("NotImplemented", 501)
    assert err(lambda: s3.put_object(Bucket="pub", Key="w", Body=b"x", GrantRead="uri=http://acs.amazonaws.com/groups/global/AllUsers"))[1] == 501
    assert err(lambda: s3.create_bucket(Bucket="rw-bucket", ACL="public-read-write")) == ("NotImplemented", 501)
    assert err(lambda: s3.head_bucket(Bucket="rw-bucket"))[1] == 404
    assert err(lambda: s3.get_object(Bucket="pub", Key="w")) == ("NoSuchKey", 404)
    # The ACL operations show the canned ACL; restating it succeeds, changing it is 501.
    def public(grants):
        return any(g["Grantee"].get("URI", "").endswith("/AllUsers") and g["Permission"] == "READ" for g in grants)
    a = s3.get_object_acl(Bucket="pub", Key="open")
    assert public(a["Grants"]) and a["Owner"]["ID"], a
    a = s3.get_object_acl(Bucket="pub", Key="closed")
    assert not public(a["Grants"]) and a["Grants"][0]["Permission"] == "FULL_CONTROL", a
    assert public(s3.get_bucket_acl(Bucket="pub")["Grants"])
    assert not public(s3.get_bucket_acl(Bucket="priv")["Grants"])
    s3.put_object_acl(Bucket="pub", Key="closed", ACL="private")
    s3.put_bucket_acl(Bucket="pub", ACL="public-read")
    # Explicit grants are refused beside a canned ACL too, by every call that takes them.
    everyone = "uri=http://acs.amazonaws.com/groups/global/AllUsers"
    assert err(lambda: s3.create_bucket(Bucket="grant-bucket", GrantRead=everyone)) == ("NotImplemented", 501)
    assert err(lambda: s3.head_bucket(Bucket="grant-bucket"))[1] == 404
    assert err(lambda: s3.put_bucket_acl(Bucket="pub", ACL="public-read", GrantWrite=everyone)) == ("NotImplemented", 501)
    assert err(lambda: s3.put_object_acl(Bucket="pub", Key="open", ACL="public-read", GrantReadACP=everyone)) == ("NotImplemented", 501)
    assert err(lambda: s3.put_object_acl(Bucket="pub", Key="closed", ACL="public-read")) == ("NotImplemented", 501)
    assert err(lambda: anon.get_object(Bucket="pub", Key="closed")) == ("AccessDenied", 403)
    assert err(lambda: s3.put_bucket_acl(Bucket="priv", ACL="public-read")) == ("NotImplemented", 501)
    assert err(lambda: s3.put_object_acl(Bucket="pub", Key="nothing", ACL="private")) == ("NoSuchKey", 404)
    assert err(lambda: anon.get_object_acl(Bucket="pub", Key="open")) == ("AccessDenied", 403)
    # CORS preflights: 400 without an origin, 403 with one (no CORS here).
    url = endpoint + "/pub/open"
    for headers, code in [({}, 400), ({"Origin": "http://x", "Access-Control-Request-Method": "GET"}, 403)]:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="OPTIONS", headers=headers))
            raise AssertionError("OPTIONS answered 2xx")
        except urllib.error.HTTPError as e:
            assert e.code == code, (headers, e.code)
    # GetBucketLocation: none for a bucket created without a constraint.
    assert s3.get_bucket_location(Bucket="pub").get("LocationConstraint") is None
    assert err(lambda: s3.get_bucket_location(Bucket="gone-bucket")) == ("NoSuchBucket", 404)
    # ListBuckets pages.
    names = sorted(b["Name"] for b in s3.list_buckets()["Buckets"])
    seen, kw = [], {}
    while True:
        r = s3.list_buckets(MaxBuckets=2, **kw)
        seen += [b["Name"] for b in r["Buckets"]]
        if "ContinuationToken" not in r:
            break
        kw = {"ContinuationToken": r["ContinuationToken"]}
    assert seen == names and len(names) > 2, (seen, names)
    assert [b["Name"] for b in s3.list_buckets(Prefix="p")["Buckets"]] == ["parts", "priv", "pub"]
    assert err(lambda: s3.list_buckets(ContinuationToken="zz"))[1] == 400


if mode == "api":
    request_ids()
    recreate()
    make_parts()
    check_parts()
    list_uploads()
    acls_and_more()
elif mode == "parts":
    make_parts()
    make_public()
elif mode == "partsc":
    check_parts()
    check_public()
else:
    sys.exit("unknown mode " + mode)
print("OK")
