//! How a call is addressed on the wire: method path and content type per protocol variant.
//!
//! * Protobuf variant (direct-mode tasks, the OCC library): path `/occ_pb.Occ/<Method>`,
//!   content type `application/grpc` (a peer may also send `application/grpc+proto`).
//! * JSON variant (FairMQ devices with the OCClite plugin): content type
//!   `application/grpc+json` and a "bare" method name instead of `/occ_pb.Occ/<Method>`.
//!
//! What "bare" means, from the anchor's source: its Go client invokes the method string
//! `"GetState"` (no slash, no package, no service), which grpc-go puts verbatim into the HTTP/2
//! `:path`; the plugin's C++ server registers methods named exactly `"GetState"`,
//! `"Transition"`, `"EventStream"`, and gRPC C++ matches `:path` against that name exactly.
//! The `http` crate (>= 1.4.1, which tonic, hyper and h2 build on) refuses any path that does
//! not start with `/`, on the client and on the server side. So the stack above the socket
//! uses `/GetState`, and [`super::bare_path`] rewrites it on the connection's bytes: the
//! client's connections strip the slash of a path without a service part (the bytes on the
//! wire read `GetState`, as the anchor's Go client sends), and the simulator's connections add
//! it back before tonic routes the call.
//!
//! The simulator accepts every spelling it can receive (`/occ_pb.Occ/GetState`, `/GetState`)
//! in either codec, chosen by the request's content type.

use http::uri::PathAndQuery;

pub const SERVICE: &str = "occ_pb.Occ";
pub const CONTENT_TYPE_PROTO: &str = "application/grpc";
pub const CONTENT_TYPE_JSON: &str = "application/grpc+json";
/// The JSON variant's method path above the socket: this prefix and the bare method name
/// (the slash is stripped on the wire, see above).
pub const JSON_PATH_PREFIX: &str = "/";

/// The four methods of the control service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    GetState,
    Transition,
    StateStream,
    EventStream,
}

impl Method {
    pub const ALL: [Method; 4] = [
        Method::GetState,
        Method::Transition,
        Method::StateStream,
        Method::EventStream,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::GetState => "GetState",
            Method::Transition => "Transition",
            Method::StateStream => "StateStream",
            Method::EventStream => "EventStream",
        }
    }

    /// The `:path` a client sends for this method in `variant`.
    pub fn path(self, variant: Variant) -> PathAndQuery {
        PathAndQuery::from_static(self.path_str(variant))
    }

    /// The `:path` on the wire: the JSON variant's is the bare method name (what [`Self::path`]
    /// becomes below the socket, see [`super::bare_path`]).
    pub fn wire_path(self, variant: Variant) -> &'static str {
        match variant {
            Variant::Protobuf => self.path_str(variant),
            Variant::Json => self.name(),
        }
    }

    fn path_str(self, variant: Variant) -> &'static str {
        match (variant, self) {
            (Variant::Protobuf, Method::GetState) => "/occ_pb.Occ/GetState",
            (Variant::Protobuf, Method::Transition) => "/occ_pb.Occ/Transition",
            (Variant::Protobuf, Method::StateStream) => "/occ_pb.Occ/StateStream",
            (Variant::Protobuf, Method::EventStream) => "/occ_pb.Occ/EventStream",
            (Variant::Json, Method::GetState) => "/GetState",
            (Variant::Json, Method::Transition) => "/Transition",
            (Variant::Json, Method::StateStream) => "/StateStream",
            (Variant::Json, Method::EventStream) => "/EventStream",
        }
    }

    /// The method a server-side `:path` names, in any accepted spelling.
    pub fn from_path(path: &str) -> Option<Method> {
        let p = path.strip_prefix('/').unwrap_or(path);
        let bare = match p.strip_prefix(SERVICE) {
            Some(rest) => rest.strip_prefix('/')?,
            None => p,
        };
        Method::ALL.into_iter().find(|m| m.name() == bare)
    }
}

/// The two encodings of the same service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Protobuf,
    Json,
}

impl Variant {
    pub fn content_type(self) -> &'static str {
        match self {
            Variant::Protobuf => CONTENT_TYPE_PROTO,
            Variant::Json => CONTENT_TYPE_JSON,
        }
    }

    /// The variant a request's content type asks for (`None`: not gRPC at all).
    pub fn from_content_type(ct: &str) -> Option<Variant> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/grpc" | "application/grpc+proto" => Some(Variant::Protobuf),
            "application/grpc+json" => Some(Variant::Json),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths_are_bare_method_names() {
        assert_eq!(Method::GetState.path(Variant::Json).as_str(), "/GetState");
        for m in Method::ALL {
            assert_eq!(
                m.path(Variant::Json).as_str(),
                format!("{JSON_PATH_PREFIX}{}", m.name())
            );
        }
        assert_eq!(
            Method::Transition.path(Variant::Protobuf).as_str(),
            "/occ_pb.Occ/Transition"
        );
    }

    #[test]
    fn server_accepts_every_spelling() {
        for m in Method::ALL {
            for v in [Variant::Json, Variant::Protobuf] {
                assert_eq!(Method::from_path(m.path(v).as_str()), Some(m));
            }
            assert_eq!(Method::from_path(m.name()), Some(m));
        }
        assert_eq!(Method::from_path("/other.Svc/GetState"), None);
        assert_eq!(Method::from_path("/occ_pb.Occ/Nope"), None);
        assert_eq!(Method::from_path("/occ_pb.OccGetState"), None);
    }

    #[test]
    fn content_types() {
        assert_eq!(
            Variant::from_content_type("application/grpc"),
            Some(Variant::Protobuf)
        );
        assert_eq!(
            Variant::from_content_type("application/grpc+json; charset=utf-8"),
            Some(Variant::Json)
        );
        assert_eq!(Variant::from_content_type("text/plain"), None);
    }
}
