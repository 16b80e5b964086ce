//! The JSON variant of the control protocol, as FairMQ devices (the OCClite plugin) speak it.
//!
//! The gRPC framing is unchanged (5-byte prefix, HTTP/2 trailers); only the message bytes are
//! JSON and the content type is `application/grpc+json`. Field names are the proto names as
//! declared (`srcState`, `transitionEvent`, ...). Enums travel as numbers (the plugin writes
//! `"trigger": 2`); on input we also accept the enum names. Missing fields take their default
//! value because Go peers marshal with `omitempty`.

use std::marker::PhantomData;

use prost::bytes::{Buf, BufMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::pb;

/// A tonic codec that writes `T` and reads `U` as JSON.
#[derive(Debug)]
pub struct JsonCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for JsonCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for JsonCodec<T, U>
where
    T: Serialize + Send + 'static,
    U: DeserializeOwned + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = JsonEncoder<T>;
    type Decoder = JsonDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        JsonEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        JsonDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct JsonEncoder<T>(PhantomData<T>);

impl<T: Serialize> Encoder for JsonEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let bytes = to_json(&item).map_err(Status::internal)?;
        dst.put_slice(&bytes);
        Ok(())
    }
}

#[derive(Debug)]
pub struct JsonDecoder<U>(PhantomData<U>);

impl<U: DeserializeOwned + Default> Decoder for JsonDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        from_json(&bytes).map(Some).map_err(Status::internal)
    }
}

/// One message of the JSON variant.
pub fn to_json<T: Serialize>(item: &T) -> Result<Vec<u8>, String> {
    serde_json::to_vec(item).map_err(|e| format!("encoding JSON message: {e}"))
}

/// One message of the JSON variant; an empty one is the default message (a peer may send
/// zero bytes for `{}`).
pub fn from_json<U: DeserializeOwned + Default>(bytes: &[u8]) -> Result<U, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(U::default());
    }
    serde_json::from_slice(bytes).map_err(|e| format!("decoding JSON message: {e}"))
}

/// An enum value on the JSON wire: its number, or its proto name.
#[derive(Deserialize)]
#[serde(untagged)]
enum EnumValue {
    Number(i32),
    Name(String),
}

fn lenient_enum<'de, D: Deserializer<'de>>(
    d: D,
    what: &str,
    by_name: fn(&str) -> Option<i32>,
) -> Result<i32, D::Error> {
    match Option::<EnumValue>::deserialize(d)? {
        None => Ok(0),
        Some(EnumValue::Number(n)) => Ok(n),
        Some(EnumValue::Name(s)) => {
            by_name(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown {what} {s:?}")))
        }
    }
}

pub(crate) fn trigger<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    lenient_enum(d, "StateChangeTrigger", |s| {
        pb::StateChangeTrigger::from_str_name(s).map(|v| v as i32)
    })
}

pub(crate) fn state_type<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    lenient_enum(d, "StateType", |s| {
        pb::StateType::from_str_name(s).map(|v| v as i32)
    })
}

pub(crate) fn device_event_type<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    lenient_enum(d, "DeviceEventType", |s| {
        pb::DeviceEventType::from_str_name(s).map(|v| v as i32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_request_uses_the_proto_field_names() {
        let req = pb::TransitionRequest {
            src_state: "IDLE".into(),
            transition_event: "INIT DEVICE".into(),
            arguments: vec![pb::ConfigEntry {
                key: "chans.data.0.address".into(),
                value: "ipc://@x".into(),
            }],
        };
        let v: serde_json::Value = serde_json::to_value(&req).unwrap();
        assert_eq!(v["srcState"], "IDLE");
        assert_eq!(v["transitionEvent"], "INIT DEVICE");
        assert_eq!(v["arguments"][0]["key"], "chans.data.0.address");
        assert_eq!(v["arguments"][0]["value"], "ipc://@x");
    }

    #[test]
    fn reply_reads_plugin_output_with_numeric_enum_and_missing_fields() {
        // What the plugin writes, and what a Go peer writes with omitempty (no ok, no trigger).
        let r: pb::TransitionReply = serde_json::from_str(
            r#"{"trigger":2,"state":"ERROR","transitionEvent":"INIT TASK","ok":false}"#,
        )
        .unwrap();
        assert_eq!(r.trigger, pb::StateChangeTrigger::DeviceError as i32);
        assert_eq!(r.state, "ERROR");
        let r: pb::TransitionReply = serde_json::from_str(r#"{"state":"READY"}"#).unwrap();
        assert!(!r.ok);
        assert_eq!(r.trigger, 0);
        let r: pb::TransitionReply =
            serde_json::from_str(r#"{"trigger":"DEVICE_INTENTIONAL","ok":true}"#).unwrap();
        assert_eq!(r.trigger, 1);
        assert!(serde_json::from_str::<pb::TransitionReply>(r#"{"trigger":"NOPE"}"#).is_err());
    }

    #[test]
    fn enums_are_written_as_numbers() {
        let r = pb::EventStreamReply {
            event: Some(pb::DeviceEvent {
                r#type: pb::DeviceEventType::EndOfStream as i32,
            }),
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"event":{"type":1}}"#
        );
        let g = pb::GetStateReply {
            state: "IDLE".into(),
            pid: 42,
        };
        assert_eq!(
            serde_json::to_string(&g).unwrap(),
            r#"{"state":"IDLE","pid":42}"#
        );
    }
}
