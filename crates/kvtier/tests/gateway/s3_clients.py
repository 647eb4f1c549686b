"""Drives `kvtier gateway` with boto3, as a user's application would.

usage: s3_clients.py ENDPOINT ACCESS SECRET MODE
MODE: full   - every supported operation, checked
      put    - create bucket `persist`, write objects for a later `check`
      check  - the objects `put` wrote are there, byte for byte
      crashw - PUT objects until killed, printing each acknowledged key
      crashc - after a crash: every acknowledged key is whole, no partial object
      unauth - against `--auth none`: signed requests (any key), presigned URLs and
               aws-chunked bodies (signed chunks, unsigned trailer) are served; malformed
               framing is refused and stores nothing
Exit status 0 and a last line `OK` when every check passed.
"""
import hashlib
import http.client
import sys
import urllib.request

import boto3
import botocore
from botocore.config import Config

endpoint, access, secret, mode = sys.argv[1:5]


def client(sec=secret):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access,
        aws_secret_access_key=sec,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


s3 = client()


def body(i, size):
    """Deterministic bytes of object i."""
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (size // 32 + 1))[:size]


def error_code(fn):
    try:
        fn()
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]
    return None


def full():
    s3.create_bucket(Bucket="clients")
    # Re-creating an owned bucket answers 200 (S3 in us-east-1) and changes nothing.
    assert s3.create_bucket(Bucket="clients")["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert "clients" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket="clients")
    assert error_code(lambda: s3.head_bucket(Bucket="nosuchbucket"))[1] == 404

    data = body(1, 256 << 10)
    r = s3.put_object(Bucket="clients", Key="kv/obj", Body=data, Metadata={"layout": "abc"}, ContentType="application/octet-stream")
    assert r["ETag"] == '"%s"' % hashlib.md5(data).hexdigest(), r["ETag"]
    # Ranged GETs: first 128 KiB, a middle range, suffix, open-ended, past the end.
    g = s3.get_object(Bucket="clients", Key="kv/obj", Range="bytes=0-131071")
    assert g["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert g["ContentRange"] == "bytes 0-131071/262144", g["ContentRange"]
    assert g["Body"].read() == data[:131072]
    g = s3.get_object(Bucket="clients", Key="kv/obj", Range="bytes=1000-1999")
    assert g["Body"].read() == data[1000:2000]
    g = s3.get_object(Bucket="clients", Key="kv/obj", Range="bytes=-100")
    assert g["ContentRange"] == "bytes 262044-262143/262144" and g["Body"].read() == data[-100:]
    g = s3.get_object(Bucket="clients", Key="kv/obj", Range="bytes=262000-")
    assert g["Body"].read() == data[262000:]
    g = s3.get_object(Bucket="clients", Key="kv/obj", Range="bytes=262000-999999")
    assert g["ContentRange"] == "bytes 262000-262143/262144" and g["Body"].read() == data[262000:]
    assert error_code(lambda: s3.get_object(Bucket="clients", Key="kv/obj", Range="bytes=262144-")) == ("InvalidRange", 416)
    g = s3.get_object(Bucket="clients", Key="kv/obj")
    assert g["ResponseMetadata"]["HTTPStatusCode"] == 200 and g["Body"].read() == data
    assert g["Metadata"] == {"layout": "abc"}, g["Metadata"]
    h = s3.head_object(Bucket="clients", Key="kv/obj")
    assert h["ContentLength"] == len(data) and h["ETag"] == r["ETag"]
    assert error_code(lambda: s3.get_object(Bucket="clients", Key="missing")) == ("NoSuchKey", 404)
    assert error_code(lambda: s3.head_object(Bucket="clients", Key="missing"))[1] == 404

    # Content-MD5: a wrong digest is refused and nothing is stored.
    assert error_code(lambda: s3.put_object(Bucket="clients", Key="bad", Body=b"abc", ContentMD5="AAAAAAAAAAAAAAAAAAAAAA=="))[0] == "BadDigest"
    assert error_code(lambda: s3.head_object(Bucket="clients", Key="bad"))[1] == 404

    # Listing with pagination, prefix, delimiter, start-after.
    for i in range(7):
        s3.put_object(Bucket="clients", Key=f"list/{i}", Body=b"x")
    s3.put_object(Bucket="clients", Key="list/sub/a", Body=b"y")
    keys, token = [], None
    while True:
        kw = {"Bucket": "clients", "Prefix": "list/", "MaxKeys": 3}
        if token:
            kw["ContinuationToken"] = token
        page = s3.list_objects_v2(**kw)
        keys += [o["Key"] for o in page.get("Contents", [])]
        assert page["KeyCount"] <= 3
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert keys == [f"list/{i}" for i in range(7)] + ["list/sub/a"], keys
    page = s3.list_objects_v2(Bucket="clients", Prefix="list/", Delimiter="/")
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["list/sub/"]
    assert len(page["Contents"]) == 7
    page = s3.list_objects_v2(Bucket="clients", Prefix="list/", StartAfter="list/4")
    assert [o["Key"] for o in page["Contents"]] == ["list/5", "list/6", "list/sub/a"]
    paginator = s3.get_paginator("list_objects_v2")
    n = sum(len(p.get("Contents", [])) for p in paginator.paginate(Bucket="clients", PaginationConfig={"PageSize": 2}))
    assert n == 9, n

    # Deletes.
    s3.delete_object(Bucket="clients", Key="list/0")
    s3.delete_object(Bucket="clients", Key="list/0")  # deleting a missing key succeeds
    r = s3.delete_objects(Bucket="clients", Delete={"Objects": [{"Key": "list/1"}, {"Key": "list/2"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["list/1", "list/2"]
    assert error_code(lambda: s3.get_object(Bucket="clients", Key="list/1"))[0] == "NoSuchKey"

    # Multipart: two parts of 5 MiB and a short last part; list parts; complete; abort.
    up = s3.create_multipart_upload(Bucket="clients", Key="big")
    p1, p2, p3 = body(2, 5 << 20), body(3, 5 << 20), body(4, 1000)
    parts = []
    for n_, b in [(1, p1), (2, p2), (3, p3)]:
        r = s3.upload_part(Bucket="clients", Key="big", UploadId=up["UploadId"], PartNumber=n_, Body=b)
        parts.append({"PartNumber": n_, "ETag": r["ETag"]})
    listed = s3.list_parts(Bucket="clients", Key="big", UploadId=up["UploadId"])["Parts"]
    assert [p["PartNumber"] for p in listed] == [1, 2, 3] and listed[2]["Size"] == 1000
    done = s3.complete_multipart_upload(Bucket="clients", Key="big", UploadId=up["UploadId"], MultipartUpload={"Parts": parts})
    assert done["ETag"].endswith('-3"'), done["ETag"]
    whole = p1 + p2 + p3
    assert s3.get_object(Bucket="clients", Key="big")["Body"].read() == whole
    g = s3.get_object(Bucket="clients", Key="big", Range="bytes=5242000-5243000")
    assert g["Body"].read() == whole[5242000:5243001]
    up = s3.create_multipart_upload(Bucket="clients", Key="aborted")
    s3.upload_part(Bucket="clients", Key="aborted", UploadId=up["UploadId"], PartNumber=1, Body=b"z")
    s3.abort_multipart_upload(Bucket="clients", Key="aborted", UploadId=up["UploadId"])
    assert error_code(lambda: s3.list_parts(Bucket="clients", Key="aborted", UploadId=up["UploadId"]))[0] == "NoSuchUpload"
    assert error_code(lambda: s3.head_object(Bucket="clients", Key="aborted"))[1] == 404
    # A small first part is refused at completion, as S3 does.
    up = s3.create_multipart_upload(Bucket="clients", Key="small")
    e1 = s3.upload_part(Bucket="clients", Key="small", UploadId=up["UploadId"], PartNumber=1, Body=b"a")["ETag"]
    e2 = s3.upload_part(Bucket="clients", Key="small", UploadId=up["UploadId"], PartNumber=2, Body=b"b")["ETag"]
    assert error_code(lambda: s3.complete_multipart_upload(Bucket="clients", Key="small", UploadId=up["UploadId"], MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]}))[0] == "EntityTooSmall"

    # Authentication: a wrong secret and an unsigned request are refused; a presigned
    # URL works.
    assert error_code(lambda: client("wrong-secret").list_buckets())[0] == "SignatureDoesNotMatch"
    try:
        urllib.request.urlopen(endpoint + "/clients/kv/obj")
        raise AssertionError("an unsigned GET was served")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "clients", "Key": "kv/obj"}, ExpiresIn=60)
    assert urllib.request.urlopen(url).read() == data

    # Buckets: not empty, then empty and deleted.
    assert error_code(lambda: s3.delete_bucket(Bucket="clients"))[0] == "BucketNotEmpty"
    s3.create_bucket(Bucket="empty-one")
    s3.delete_bucket(Bucket="empty-one")
    assert error_code(lambda: s3.head_bucket(Bucket="empty-one"))[1] == 404


def raw_put(key, framed, headers):
    """PUTs `framed` as it is (no client library re-encodes it); (status, body)."""
    host = endpoint.split("//", 1)[1]
    c = http.client.HTTPConnection(host, timeout=30)
    c.request("PUT", "/open/" + key, body=framed, headers={"Content-Length": str(len(framed)), **headers})
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def aws_chunked(data, chunk, signed):
    sig = ";chunk-signature=" + "0f" * 32 if signed else ""
    out = b""
    for i in range(0, len(data), chunk):
        c = data[i:i + chunk]
        out += b"%x%s\r\n" % (len(c), sig.encode()) + c + b"\r\n"
    out += b"0" + sig.encode() + b"\r\n"
    if not signed:
        out += b"x-amz-checksum-crc32:AAAAAA==\r\n"
    return out + b"\r\n"


def unauthenticated():
    # boto3 signs every request with whatever key it has: served, not refused.
    s3.create_bucket(Bucket="open")
    data = body(5, 300_000)
    s3.put_object(Bucket="open", Key="signed", Body=data)
    assert s3.get_object(Bucket="open", Key="signed")["Body"].read() == data
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="open")["Contents"]] == ["signed"]
    up = s3.create_multipart_upload(Bucket="open", Key="multi")
    p1, p2 = body(6, 5 << 20), body(7, 1234)
    parts = []
    for n_, b in [(1, p1), (2, p2)]:
        r = s3.upload_part(Bucket="open", Key="multi", UploadId=up["UploadId"], PartNumber=n_, Body=b)
        parts.append({"PartNumber": n_, "ETag": r["ETag"]})
    s3.complete_multipart_upload(Bucket="open", Key="multi", UploadId=up["UploadId"], MultipartUpload={"Parts": parts})
    assert s3.get_object(Bucket="open", Key="multi")["Body"].read() == p1 + p2
    # Presigned URLs, SigV4 and SigV2: the signing parameters are ignored.
    for version, mark in [("s3v4", "X-Amz-Signature="), ("s3", "AWSAccessKeyId=")]:
        signer = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
                              region_name="us-east-1",
                              config=Config(signature_version=version, s3={"addressing_style": "path"}))
        url = signer.generate_presigned_url("get_object", Params={"Bucket": "open", "Key": "signed"}, ExpiresIn=60)
        assert mark in url, url
        assert urllib.request.urlopen(url).read() == data
        url = signer.generate_presigned_url("put_object", Params={"Bucket": "open", "Key": version}, ExpiresIn=60)
        urllib.request.urlopen(urllib.request.Request(url, data=b"through a URL", method="PUT")).read()
        assert s3.get_object(Bucket="open", Key=version)["Body"].read() == b"through a URL"
    # Unsigned requests too.
    urllib.request.urlopen(urllib.request.Request(endpoint + "/open/plain", data=b"plain", method="PUT")).read()
    assert urllib.request.urlopen(endpoint + "/open/plain").read() == b"plain"

    # aws-chunked bodies, as SDKs stream them: the object is the decoded bytes.
    auth = {"Authorization": "AWS4-HMAC-SHA256 Credential=x/20261124/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=" + "ab" * 32}
    data = body(8, 200_000)
    status, text = raw_put("chunked-signed", aws_chunked(data, 65536, True), {
        **auth,
        "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data)),
    })
    assert status == 200, (status, text)
    g = s3.get_object(Bucket="open", Key="chunked-signed")
    assert g["Body"].read() == data and "ContentEncoding" not in g, g.get("ContentEncoding")
    status, text = raw_put("chunked-trailer", aws_chunked(data, 8192, False), {
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "Content-Encoding": "gzip,aws-chunked",
        "x-amz-trailer": "x-amz-checksum-crc32",
        "x-amz-decoded-content-length": str(len(data)),
    })
    assert status == 200, (status, text)
    g = s3.get_object(Bucket="open", Key="chunked-trailer")
    assert g["Body"].read() == data and g["ContentEncoding"] == "gzip", g.get("ContentEncoding")
    # Malformed framing, a length that does not match, no decoded length: refused, and
    # nothing stored under the key.
    bad = [
        (aws_chunked(data, 65536, True), str(len(data) + 1), 400),
        (aws_chunked(data, 65536, True), str(len(data) - 1), 400),
        (aws_chunked(data, 65536, True)[:-40], str(len(data)), 400),
        (b"not-hex\r\n" + data, str(len(data)), 400),
        (aws_chunked(data, 65536, True), None, 411),
    ]
    for framed, decoded, want in bad:
        headers = {**auth, "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"}
        if decoded is not None:
            headers["x-amz-decoded-content-length"] = decoded
        status, text = raw_put("refused", framed, headers)
        assert status == want, (status, text, decoded)
        assert error_code(lambda: s3.head_object(Bucket="open", Key="refused"))[1] == 404


def put():
    s3.create_bucket(Bucket="persist")
    for i in range(20):
        s3.put_object(Bucket="persist", Key=f"o/{i}", Body=body(i, 1000 + 7919 * i))
    s3.delete_object(Bucket="persist", Key="o/3")


def check():
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="persist")["Contents"]]
    assert keys == sorted(f"o/{i}" for i in range(20) if i != 3), keys
    for i in range(20):
        if i == 3:
            continue
        assert s3.get_object(Bucket="persist", Key=f"o/{i}")["Body"].read() == body(i, 1000 + 7919 * i)


def crash_writer():
    try:
        s3.create_bucket(Bucket="crash")
    except botocore.exceptions.ClientError:
        pass
    i = 0
    while True:
        s3.put_object(Bucket="crash", Key=f"c/{i}", Body=body(i, (i % 16 + 1) * 65536 + i))
        print(f"acked c/{i}", flush=True)
        i += 1


def crash_check():
    acked = [line.split()[1] for line in open(sys.argv[5]) if line.startswith("acked ")]
    assert acked, "the writer acknowledged nothing before the kill"
    listed = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="crash"):
        for o in page.get("Contents", []):
            listed[o["Key"]] = o
    for key in acked:
        assert key in listed, f"acknowledged {key} lost"
    for key, o in listed.items():
        i = int(key.split("/")[1])
        want = body(i, (i % 16 + 1) * 65536 + i)
        got = s3.get_object(Bucket="crash", Key=key)["Body"].read()
        assert got == want, f"{key}: {len(got)} bytes, not the {len(want)} written"
        assert o["Size"] == len(want)
    print(f"{len(acked)} acknowledged, {len(listed)} listed, all whole")


{"full": full, "unauth": unauthenticated, "put": put, "check": check, "crashw": crash_writer, "crashc": crash_check}[mode]()
print("OK")
