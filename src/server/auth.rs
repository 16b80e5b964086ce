//! Bearer-token authentication of the gRPC API.

use tonic::{Request, Status};

/// Checks `authorization: Bearer <token>` on every call (constant-time comparison).
#[derive(Clone)]
pub struct BearerAuth {
    token: Option<String>,
}

impl BearerAuth {
    pub fn new(token: Option<String>) -> Self {
        BearerAuth { token }
    }
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(req);
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(g) if same(g.as_bytes(), token.as_bytes()) => Ok(req),
            Some(_) => Err(Status::unauthenticated("invalid bearer token")),
            None => Err(Status::unauthenticated(
                "missing bearer token (authorization: Bearer ...)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    fn req(h: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = h {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    #[test]
    fn token_required_when_configured() {
        let mut a = BearerAuth::new(Some("s3cret".into()));
        assert!(a.call(req(Some("Bearer s3cret"))).is_ok());
        assert_eq!(
            a.call(req(Some("Bearer nope"))).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            a.call(req(None)).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let mut open = BearerAuth::new(None);
        assert!(open.call(req(None)).is_ok());
    }
}
