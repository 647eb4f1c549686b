//! Bearer tokens and their scopes. A token names one scope: the admin token the admin
//! endpoints; the data token every tenant's data; a tenant token (`[auth.tenants.NAME]`)
//! only its tenant's layouts: those whose salt is the tenant's, or the tenant's nested
//! with a salt of the caller's (`salt/…`, as an engine's per-request cache salt). The
//! scope a data request acts in is put in its extensions ([`Scope`]); each handler checks
//! the layout it names against it, and registration takes the salt from the token, not
//! from the request.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kvtier_core::Layout;
use kvtier_node::AuthSettings;

use crate::error::ApiError;

/// Whom a data request acts for.
#[derive(Debug, Clone)]
pub enum Scope {
    /// Every tenant: the data token, or a server without data tokens (the shared arena's
    /// socket too, whose file mode is its guard).
    All,
    /// One tenant: its name (for messages) and salt.
    Tenant {
        /// The tenant's name in the settings.
        name: Arc<str>,
        /// Its salt: every layout it reaches carries it.
        salt: Arc<[u8]>,
    },
}

impl Scope {
    /// Refuses (403 `wrong_tenant`) a layout this scope does not reach.
    pub fn admits(&self, layout: &Layout) -> Result<(), ApiError> {
        match self {
            Self::All => Ok(()),
            Self::Tenant { salt, .. } if within(salt, &layout.key().tenant_salt) => Ok(()),
            Self::Tenant { name, .. } => Err(wrong_tenant(format!(
                "layout {} is not one of tenant {name}'s layouts (its token reaches only \
                 layouts registered under the tenant's salt)",
                layout.digest().to_hex()
            ))),
        }
    }

    /// The salt a layout registered in this scope gets: in a tenant's scope the tenant's
    /// salt, with the one the request gave (`given`, if any) nested under it — so a
    /// caller may still keep its own users apart, never outside its tenant. In the
    /// all-tenants scope, `given`.
    pub fn salt_for(&self, given: Vec<u8>) -> Vec<u8> {
        match self {
            Self::All => given,
            Self::Tenant { salt, .. } if given.is_empty() => salt.to_vec(),
            Self::Tenant { salt, .. } => [&salt[..], &[NEST], &given[..]].concat(),
        }
    }
}

/// Separates a tenant's salt from a caller's nested under it. Tenants' salts are
/// prefix-free (checked at start), so no tenant's salt, nested or not, begins with
/// another's followed by this byte.
const NEST: u8 = b'/';

/// Whether `salt` is `tenant`'s own salt or one nested under it.
fn within(tenant: &[u8], salt: &[u8]) -> bool {
    salt == tenant || (salt.starts_with(tenant) && salt.get(tenant.len()) == Some(&NEST))
}

fn wrong_tenant(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "wrong_tenant", message)
}

/// What a group of routes requires. Tokens are fixed for the server's life, so they are
/// read once, when the router is built.
#[derive(Clone)]
pub enum Guard {
    /// No token: every request acts for every tenant.
    Open,
    /// One of these tokens; the tenants' only if `tenants_allowed`.
    Tokens {
        /// Token and scope, the all-tenants token (if any) among them.
        tokens: Arc<[(Box<str>, Scope)]>,
        /// Whether a tenant's token is enough (data routes naming a layout), or the
        /// all-tenants scope is needed (stats, metrics).
        tenants_allowed: bool,
    },
    /// No token configured for an admin route: it is disabled.
    Disabled,
}

impl Guard {
    /// The data routes' guard: those that name a layout (`tenants_allowed`) or not.
    pub fn data(auth: &AuthSettings, tenants_allowed: bool) -> Self {
        if !auth.data_guarded() {
            return Self::Open;
        }
        let mut tokens: Vec<(Box<str>, Scope)> = auth
            .data_token
            .iter()
            .map(|t| (t.as_str().into(), Scope::All))
            .collect();
        for (name, tenant) in &auth.tenants {
            // Settings were validated at start: the salt is hex.
            let salt = tenant.salt_bytes().unwrap_or_default();
            tokens.push((
                tenant.token.as_str().into(),
                Scope::Tenant {
                    name: name.as_str().into(),
                    salt: salt.into(),
                },
            ));
        }
        Self::Tokens {
            tokens: tokens.into(),
            tenants_allowed,
        }
    }

    /// The admin routes' guard.
    pub fn admin(auth: &AuthSettings) -> Self {
        match &auth.admin_token {
            Some(t) => Self::Tokens {
                tokens: vec![(t.as_str().into(), Scope::All)].into(),
                tenants_allowed: false,
            },
            None => Self::Disabled,
        }
    }
}

/// Compares in time independent of where the strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware: checks the bearer token and puts the request's [`Scope`] in its
/// extensions.
pub async fn authorize(State(guard): State<Guard>, mut req: Request, next: Next) -> Response {
    let (tokens, tenants_allowed) = match &guard {
        Guard::Open => {
            req.extensions_mut().insert(Scope::All);
            return next.run(req).await;
        }
        Guard::Tokens {
            tokens,
            tenants_allowed,
        } => (tokens, *tenants_allowed),
        Guard::Disabled => {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "admin_disabled",
                "admin endpoints are disabled: no admin token is configured (admin_token)",
            )
            .into_response();
        }
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(given) = given else {
        let mut resp = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "token_required",
            "this endpoint requires `Authorization: Bearer <token>`",
        )
        .into_response();
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return resp;
    };
    // Every token is compared, so the time taken does not say which one nearly matched.
    let mut found = None;
    for (token, scope) in tokens.iter() {
        if same(given.as_bytes(), token.as_bytes()) {
            found = Some(scope.clone());
        }
    }
    match found {
        Some(Scope::Tenant { name, .. }) if !tenants_allowed => ApiError::new(
            StatusCode::FORBIDDEN,
            "wrong_scope",
            format!(
                "tenant {name}'s token reaches only its own layouts; this endpoint needs the \
                 data token (every tenant)"
            ),
        )
        .into_response(),
        Some(scope) => {
            req.extensions_mut().insert(scope);
            next.run(req).await
        }
        None => ApiError::new(
            StatusCode::FORBIDDEN,
            "bad_token",
            "the bearer token is not valid here",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_reaches_its_salt_and_salts_nested_under_it_only() {
        let acme = [0xac, 0x01];
        assert!(within(&acme, &[0xac, 0x01]));
        assert!(within(&acme, &[0xac, 0x01, NEST, 0x90]));
        assert!(within(&acme, &[0xac, 0x01, NEST]));
        // A longer salt that merely begins with the tenant's is another tenant's.
        assert!(!within(&acme, &[0xac, 0x01, 0x90]));
        assert!(!within(&acme, &[0xac]));
        assert!(!within(&acme, &[]));
        let scope = Scope::Tenant {
            name: "acme".into(),
            salt: acme.to_vec().into(),
        };
        assert_eq!(scope.salt_for(Vec::new()), acme);
        assert_eq!(scope.salt_for(vec![0x90]), vec![0xac, 0x01, NEST, 0x90]);
        assert_eq!(Scope::All.salt_for(vec![0x90]), vec![0x90]);
    }
}
