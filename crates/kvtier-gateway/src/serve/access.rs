//! What an anonymous request (no signature, with SigV4 authentication on) may do.
//!
//! Only GetObject and HeadObject get through, and the operation itself serves nothing
//! but an object written with the canned ACL `public-read` (`s3/object.rs` checks the
//! object it actually reads, so an object replaced by a private one in between is never
//! served). Everything else is 403 `AccessDenied` — except that a request naming a
//! bucket that does not exist is 404 `NoSuchBucket`, as S3 answers it whoever asks.
//! Signed requests are the owner's: the gateway has one account.

use std::sync::Arc;

use s3s::S3Result;
use s3s::access::{S3Access, S3AccessContext};
use s3s::path::S3Path;

use crate::s3::access_denied;
use crate::store::GatewayStore;

/// See the module docs.
#[derive(Debug)]
pub struct PublicReadOnly {
    pub store: Arc<GatewayStore>,
}

#[async_trait::async_trait]
impl S3Access for PublicReadOnly {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_some() {
            return Ok(());
        }
        let (bucket, is_object) = match cx.s3_path() {
            S3Path::Root => return Err(access_denied()),
            S3Path::Bucket { bucket } => (bucket, false),
            S3Path::Object { bucket, .. } => (bucket, true),
        };
        if !self.store.has_bucket(bucket) {
            return Err(s3s::s3_error!(
                NoSuchBucket,
                "The specified bucket does not exist"
            ));
        }
        match cx.s3_op().name() {
            "GetObject" | "HeadObject" if is_object => Ok(()),
            _ => Err(access_denied()),
        }
    }
}
