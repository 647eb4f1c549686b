//! The S3 operations, on top of [`GatewayStore`].
//!
//! Supported: CreateBucket, HeadBucket, GetBucketLocation, DeleteBucket, ListBuckets,
//! PutObject, GetObject, HeadObject (by Range or `partNumber`), GetObjectAttributes,
//! DeleteObject, DeleteObjects, ListObjectsV2, ListObjects (v1), ListObjectVersions (each
//! object its one `null` version: no versioning here), multipart upload (create, upload
//! part, complete, abort, list parts, list uploads), canned ACLs (private, public-read;
//! Get*Acl, Put*Acl restating them: `acl.rs`), with S3's conditional requests. Everything
//! else answers `NotImplemented` (s3s's default). Request parsing, XML, and SigV4 checks
//! are s3s's.

mod acl;
mod input;
mod list;
mod multipart;
mod object;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use s3s::dto::{
    AbortMultipartUploadInput, AbortMultipartUploadOutput, BucketLocationConstraint,
    CompleteMultipartUploadInput, CompleteMultipartUploadOutput, CreateBucketInput,
    CreateBucketOutput, CreateMultipartUploadInput, CreateMultipartUploadOutput, DeleteBucketInput,
    DeleteBucketOutput, DeleteObjectInput, DeleteObjectOutput, DeleteObjectsInput,
    DeleteObjectsOutput, ETag, GetBucketAclInput, GetBucketAclOutput, GetBucketLocationInput,
    GetBucketLocationOutput, GetObjectAclInput, GetObjectAclOutput, GetObjectAttributesInput,
    GetObjectAttributesOutput, GetObjectInput, GetObjectOutput, HeadBucketInput, HeadBucketOutput,
    HeadObjectInput, HeadObjectOutput, ListBucketsInput, ListBucketsOutput,
    ListMultipartUploadsInput, ListMultipartUploadsOutput, ListObjectVersionsInput,
    ListObjectVersionsOutput, ListObjectsInput, ListObjectsOutput, ListObjectsV2Input,
    ListObjectsV2Output, ListPartsInput, ListPartsOutput, PutBucketAclInput, PutBucketAclOutput,
    PutObjectAclInput, PutObjectAclOutput, PutObjectInput, PutObjectOutput, Timestamp,
    UploadPartInput, UploadPartOutput,
};
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

pub use input::{MAX_KEY_BYTES, MAX_METADATA_BYTES, check_key};
pub use object::access_denied;

use crate::serve::Counters;
use crate::store::{GatewayStore, StoreError};

/// The S3 service: a handle on the store and the request counters.
#[derive(Debug, Clone)]
pub struct Gateway {
    store: Arc<GatewayStore>,
    counters: Arc<Counters>,
    /// Requests are authenticated (SigV4): a request without credentials is anonymous
    /// and reads only `public-read` objects. Without authentication (`--auth none`)
    /// every request acts as the owner.
    authenticated: bool,
}

impl Gateway {
    /// Serves `store`, counting into `counters`, every request acting as the owner (no
    /// authentication).
    pub fn with_counters(store: Arc<GatewayStore>, counters: Arc<Counters>) -> Self {
        Self {
            store,
            counters,
            authenticated: false,
        }
    }

    /// Requests are authenticated: those without credentials are anonymous.
    pub fn authenticated(mut self) -> Self {
        self.authenticated = true;
        self
    }

    fn anonymous<T>(&self, req: &S3Request<T>) -> bool {
        self.authenticated && req.credentials.is_none()
    }
}

pub(crate) fn s3_err(e: StoreError) -> S3Error {
    let code = match &e {
        StoreError::NoSuchBucket => S3ErrorCode::NoSuchBucket,
        StoreError::NoSuchKey => S3ErrorCode::NoSuchKey,
        StoreError::BucketExists => S3ErrorCode::BucketAlreadyOwnedByYou,
        StoreError::BucketNotEmpty => S3ErrorCode::BucketNotEmpty,
        StoreError::NoSuchUpload => S3ErrorCode::NoSuchUpload,
        StoreError::InvalidPart(_) => S3ErrorCode::InvalidPart,
        StoreError::InvalidPartOrder => S3ErrorCode::InvalidPartOrder,
        StoreError::EntityTooSmall => S3ErrorCode::EntityTooSmall,
        StoreError::EntityTooLarge(_) => S3ErrorCode::EntityTooLarge,
        StoreError::PreconditionFailed => S3ErrorCode::PreconditionFailed,
        StoreError::IncompleteBody(_) => S3ErrorCode::IncompleteBody,
        StoreError::Corrupt(_) => {
            // The client is told the object is gone; the operator finds the details in
            // the log (the store has dropped the record).
            return S3Error::with_message(
                S3ErrorCode::NoSuchKey,
                "the object failed verification and was dropped",
            );
        }
        StoreError::Io(m) => {
            tracing::error!(error = %m, "gateway storage failed");
            S3ErrorCode::InternalError
        }
    };
    S3Error::with_message(code, e.to_string())
}

pub(crate) fn timestamp(ms: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_millis(ms))
}

pub(crate) fn etag(value: &str) -> ETag {
    ETag::Strong(value.to_owned())
}

/// Runs blocking store work (disk writes, fsync) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> S3Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(s3_err),
        Err(e) => Err(S3Error::internal_error(e)),
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let store = self.store.clone();
        let input = req.input;
        let public_read = input::canned_public_read(
            input.acl.as_ref().map(|a| a.as_str()),
            &input::bucket_grants!(input),
        )?;
        let location = input
            .create_bucket_configuration
            .and_then(|c| c.location_constraint)
            .map(|l| l.as_str().to_owned())
            .filter(|l| !l.is_empty() && l != "us-east-1");
        if let Some(l) = &location
            && (l.len() > 64
                || !l
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':')))
        {
            return Err(s3_error!(
                InvalidLocationConstraint,
                "The specified location-constraint is not valid"
            ));
        }
        let bucket = input.bucket;
        // The same rules as `--create-bucket`: a name some client cannot address (by path
        // or virtual host) is refused rather than created.
        if !crate::cli::valid_bucket_name(&bucket) {
            return Err(s3_error!(
                InvalidBucketName,
                "The specified bucket is not valid."
            ));
        }
        let path = format!("/{bucket}");
        // Creating a bucket this account owns already answers 200 and changes nothing,
        // as S3 answers in us-east-1 (the region this gateway reports); S3 elsewhere
        // answers 409 `BucketAlreadyOwnedByYou`. The gateway has one account, so every
        // existing bucket is the caller's own.
        match blocking(move || store.create_bucket_with(&bucket, public_read, location)).await {
            Ok(()) => {}
            Err(e) if e.code() == &S3ErrorCode::BucketAlreadyOwnedByYou => {}
            Err(e) => return Err(e),
        }
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(path),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        if !self.store.has_bucket(&req.input.bucket) {
            return Err(s3_err(StoreError::NoSuchBucket));
        }
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let store = self.store.clone();
        let bucket = req.input.bucket;
        blocking(move || store.delete_bucket(&bucket)).await?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let Some(location) = self.store.bucket_location(&req.input.bucket) else {
            return Err(s3_err(StoreError::NoSuchBucket));
        };
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: location.map(BucketLocationConstraint::from),
        }))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        list::buckets(&self.store, req.input).map(S3Response::new)
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        object::put(self, req).await.map(S3Response::new)
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let anonymous = self.anonymous(&req);
        object::get(self, req.input, anonymous).map(S3Response::new)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let anonymous = self.anonymous(&req);
        object::head(self, req.input, anonymous).map(S3Response::new)
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        acl::get_object(self, req.input).map(S3Response::new)
    }

    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        acl::put_object(self, req.input).map(S3Response::new)
    }

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        acl::get_bucket(self, req.input).map(S3Response::new)
    }

    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        acl::put_bucket(self, req.input).map(S3Response::new)
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        object::attributes(self, req.input).map(S3Response::new)
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        object::delete(self, req).await.map(S3Response::new)
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        object::delete_many(self, req.input)
            .await
            .map(S3Response::new)
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        list::v2(&self.store, req.input).map(S3Response::new)
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        list::v1(&self.store, req.input).map(S3Response::new)
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        list::versions(&self.store, req.input).map(S3Response::new)
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        multipart::create(self, req.input)
            .await
            .map(S3Response::new)
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        multipart::upload_part(self, req.input)
            .await
            .map(S3Response::new)
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        multipart::complete(self, req).await.map(S3Response::new)
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        let store = self.store.clone();
        blocking(move || store.abort_upload(&input.upload_id, &input.bucket, &input.key)).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        multipart::list_uploads(self, req.input).map(S3Response::new)
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        multipart::list_parts(self, req.input).map(S3Response::new)
    }
}
