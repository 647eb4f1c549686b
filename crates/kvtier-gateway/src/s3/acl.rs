//! The ACL operations, over the canned ACLs the gateway keeps (one account; an object or
//! bucket is private or `public-read`, fixed when it is written: see docs/gateway.md).
//!
//! - GetObjectAcl, GetBucketAcl: the owner with `FULL_CONTROL`, and for `public-read`
//!   the AllUsers group with `READ`.
//! - PutObjectAcl, PutBucketAcl: a canned ACL that restates what the object or bucket
//!   already has succeeds and changes nothing; any change, an access control policy
//!   document and grant headers are 501 `NotImplemented` (an ACL is fixed when the object
//!   or bucket is written), never silently ignored.

use s3s::dto::{
    GetBucketAclInput, GetBucketAclOutput, GetObjectAclInput, GetObjectAclOutput, Grant, Grantee,
    Permission, PutBucketAclInput, PutBucketAclOutput, PutObjectAclInput, PutObjectAclOutput, Type,
};
use s3s::{S3Result, s3_error};

use super::input::{bucket_grants, canned_public_read, check_key};
use super::list::owner;
use super::{Gateway, s3_err};
use crate::store::StoreError;

const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";

fn grants(public_read: bool) -> Vec<Grant> {
    let o = owner();
    let mut out = vec![Grant {
        grantee: Some(Grantee {
            display_name: o.display_name,
            id: o.id,
            type_: Type::from_static(Type::CANONICAL_USER),
            email_address: None,
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }];
    if public_read {
        out.push(Grant {
            grantee: Some(Grantee {
                display_name: None,
                id: None,
                type_: Type::from_static(Type::GROUP),
                email_address: None,
                uri: Some(ALL_USERS.to_owned()),
            }),
            permission: Some(Permission::from_static(Permission::READ)),
        });
    }
    out
}

fn bucket_public_read(gw: &Gateway, bucket: &str) -> S3Result<bool> {
    gw.store
        .bucket_public_read(bucket)
        .ok_or_else(|| s3_err(StoreError::NoSuchBucket))
}

pub(super) fn get_object(gw: &Gateway, input: GetObjectAclInput) -> S3Result<GetObjectAclOutput> {
    check_key(&input.key)?;
    let object = gw.store.object(&input.bucket, &input.key).map_err(s3_err)?;
    Ok(GetObjectAclOutput {
        grants: Some(grants(object.info.public_read)),
        owner: Some(owner()),
        ..GetObjectAclOutput::default()
    })
}

pub(super) fn get_bucket(gw: &Gateway, input: GetBucketAclInput) -> S3Result<GetBucketAclOutput> {
    let public_read = bucket_public_read(gw, &input.bucket)?;
    Ok(GetBucketAclOutput {
        grants: Some(grants(public_read)),
        owner: Some(owner()),
    })
}

/// Whether a Put*Acl request restates `current`; 501 for anything else.
fn restates(
    current: bool,
    acl: Option<&str>,
    policy: bool,
    grants: &[Option<&String>],
) -> S3Result<()> {
    if policy {
        return Err(s3_error!(
            NotImplemented,
            "access control policy documents are not supported; ACLs are canned and fixed when written"
        ));
    }
    if acl.is_none() {
        return Err(s3_error!(
            NotImplemented,
            "give a canned ACL (x-amz-acl): private or public-read"
        ));
    }
    if canned_public_read(acl, grants)? != current {
        return Err(s3_error!(
            NotImplemented,
            "an ACL cannot be changed after it is written here; write the object (or create the bucket) with the ACL wanted"
        ));
    }
    Ok(())
}

pub(super) fn put_object(gw: &Gateway, input: PutObjectAclInput) -> S3Result<PutObjectAclOutput> {
    check_key(&input.key)?;
    let object = gw.store.object(&input.bucket, &input.key).map_err(s3_err)?;
    restates(
        object.info.public_read,
        input.acl.as_ref().map(|a| a.as_str()),
        input.access_control_policy.is_some(),
        &bucket_grants!(input),
    )?;
    Ok(PutObjectAclOutput::default())
}

pub(super) fn put_bucket(gw: &Gateway, input: PutBucketAclInput) -> S3Result<PutBucketAclOutput> {
    let public_read = bucket_public_read(gw, &input.bucket)?;
    restates(
        public_read,
        input.acl.as_ref().map(|a| a.as_str()),
        input.access_control_policy.is_some(),
        &bucket_grants!(input),
    )?;
    Ok(PutBucketAclOutput::default())
}
