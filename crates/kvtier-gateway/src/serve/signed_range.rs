//! A malformed or multi-range `Range` header that the request's SigV4 signature covers.
//!
//! S3 ignores such a header and sends the whole object with 200. The listener drops an
//! unsigned one before s3s sees it (`wrap.rs`), but a signed one cannot be dropped: the
//! signature would no longer match. And s3s, once the signature is checked, parses the
//! header and refuses it (400).
//!
//! So the listener only marks the request ([`SignedBadRange`], a request extension, which
//! a client cannot set). s3s checks the signature as usual; then, before it parses the
//! operation's input, it asks its custom route whether to take the request.
//! [`WholeObject`] takes marked GETs and HEADs, but only with verified credentials. It
//! sends them on without the header and without the signature, which has been checked
//! already, to a second s3s service over the same gateway, one that does not authenticate.
//! Every other part of the request (conditions, `partNumber`, response overrides) reaches
//! the operation unchanged.

use http::Extensions;
use http::{HeaderMap, Method, Uri};
use s3s::route::S3Route;
use s3s::service::S3Service;
use s3s::{Body, S3Request, S3Response, S3Result};

use super::unsigned;

/// Set by the listener on a request whose signed `Range` header S3 would ignore.
#[derive(Debug, Clone, Copy)]
pub struct SignedBadRange;

/// The route that serves marked requests (see the module docs).
#[derive(Debug)]
pub struct WholeObject {
    /// The same gateway behind an s3s service without authentication. It is reached
    /// only from [`WholeObject::call`], after s3s has verified the request's signature.
    pub verified: S3Service,
}

#[async_trait::async_trait]
impl S3Route for WholeObject {
    fn is_match(&self, method: &Method, _: &Uri, _: &HeaderMap, ext: &mut Extensions) -> bool {
        (method == Method::GET || method == Method::HEAD) && ext.get::<SignedBadRange>().is_some()
    }

    async fn check_access(&self, req: &mut S3Request<Body>) -> S3Result<()> {
        // The signature was checked by s3s before the route was asked; a request that
        // reaches this point without credentials was not signed, and is not served.
        match req.credentials {
            Some(_) => Ok(()),
            None => Err(crate::s3::access_denied()),
        }
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let mut forward = http::Request::new(req.input);
        *forward.method_mut() = req.method;
        *forward.uri_mut() = req.uri;
        *forward.headers_mut() = req.headers;
        let (mut parts, body) = forward.into_parts();
        parts.headers.remove(http::header::RANGE);
        unsigned::drop_signature(&mut parts);
        let res = self
            .verified
            .call(http::Request::from_parts(parts, body))
            .await
            .map_err(|e| {
                s3s::S3Error::with_message(s3s::S3ErrorCode::InternalError, format!("{e:?}"))
            })?;
        let (parts, body) = res.into_parts();
        let mut out = S3Response::new(body);
        out.status = Some(parts.status);
        out.headers = parts.headers;
        out.extensions = parts.extensions;
        Ok(out)
    }
}
