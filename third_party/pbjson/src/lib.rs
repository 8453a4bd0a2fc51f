//! `pbjson` is a set of crates to automatically generate [`serde::Serialize`] and
//! [`serde::Deserialize`] implementations for [prost][1] generated structs that
//! are compliant with the [protobuf JSON mapping][2]
//!
//! See [pbjson-build][3] for usage instructions
//!
//! [1]: https://github.com/tokio-rs/prost
//! [2]: https://developers.google.com/protocol-buffers/docs/proto3#json
//! [3]: https://docs.rs/pbjson-build
//!
#![deny(rustdoc::broken_intra_doc_links, rustdoc::bare_urls, rust_2018_idioms)]
#![warn(
    missing_debug_implementations,
    clippy::explicit_iter_loop,
    clippy::use_self,
    clippy::clone_on_ref_ptr,
    clippy::future_not_send
)]

#[doc(hidden)]
pub mod private {
    //! retcd's patch (see RETCD.md): numbers and bytes are read as etcd's
    //! grpc-gateway (Go's `encoding/json` under golang/protobuf's `jsonpb`)
    //! reads them, not by pbjson's own, more lenient, rules.

    /// Re-export base64
    pub use base64;

    use base64::Engine;
    use base64::engine::DecodePaddingMode;
    use base64::engine::{GeneralPurpose, GeneralPurposeConfig};
    use serde::Deserialize;
    use serde::de::{SeqAccess, Visitor};
    use std::borrow::Cow;
    use std::str::FromStr;

    /// Used to parse a number from either a string or its raw representation
    #[derive(Debug, Copy, Clone, PartialOrd, PartialEq, Hash, Ord, Eq)]
    pub struct NumberDeserialize<T>(pub T);

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content<'a, T> {
        #[serde(borrow)]
        Str(Cow<'a, str>),
        Number(T),
        /// `-0`, which serde_json reads as a float
        Float(f64),
    }

    /// What `jsonpb` makes of a quoted number: the text between the quotes
    /// read as a JSON value, so white space around it is fine, `null` is
    /// no value (zero), and `+1` or `01` are not numbers.
    fn go_number_text(s: &str) -> Result<&str, String> {
        let t = s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
        if t == "null" {
            return Ok("0");
        }
        let digits = t.strip_prefix('-').unwrap_or(t);
        if digits.starts_with('+') || (digits.len() > 1 && digits.starts_with('0') && digits.as_bytes()[1].is_ascii_digit()) || digits.is_empty() || !digits.as_bytes()[0].is_ascii_digit() {
            return Err(format!("invalid number {s:?}"));
        }
        Ok(t)
    }

    impl<'de, T> serde::Deserialize<'de> for NumberDeserialize<T>
    where
        T: FromStr + serde::Deserialize<'de>,
        <T as FromStr>::Err: std::error::Error,
    {
        fn deserialize<D>(deserializer: D) -> Result<Self, D::Error>
        where
            D: serde::Deserializer<'de>,
        {
            let content = Content::deserialize(deserializer)?;
            Ok(Self(match content {
                Content::Str(v) => go_number_text(&v)
                    .map_err(serde::de::Error::custom)?
                    .parse()
                    .map_err(serde::de::Error::custom)?,
                Content::Number(v) => v,
                // serde_json reads the integer `-0` as the float -0.0 (and
                // `-0.0` too, which Go refuses; `0.0` and `0e0` stay refused)
                Content::Float(f) if f == 0.0 && f.is_sign_negative() => {
                    "0".parse().map_err(serde::de::Error::custom)?
                }
                Content::Float(f) => {
                    return Err(serde::de::Error::custom(format!("invalid number {f}")));
                }
            }))
        }
    }

    struct Base64Visitor;

    impl<'de> Visitor<'de> for Base64Visitor {
        type Value = Vec<u8>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("a base64 string")
        }

        /// Go's `base64.StdEncoding`: the standard alphabet, padded, line
        /// breaks ignored, unused bits of the last symbol not checked.
        fn visit_str<E>(self, s: &str) -> Result<Self::Value, E>
        where
            E: serde::de::Error,
        {
            const GO_STD: GeneralPurpose = GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                GeneralPurposeConfig::new()
                    .with_decode_padding_mode(DecodePaddingMode::RequireCanonical)
                    .with_decode_allow_trailing_bits(true),
            );
            let s: Cow<'_, str> = if s.contains(['\r', '\n']) {
                s.replace(['\r', '\n'], "").into()
            } else {
                s.into()
            };
            GO_STD.decode(s.as_bytes()).map_err(serde::de::Error::custom)
        }

        /// Go's `encoding/json` also takes a byte string as an array of
        /// numbers.
        fn visit_seq<A>(self, mut seq: A) -> Result<Self::Value, A::Error>
        where
            A: SeqAccess<'de>,
        {
            let mut out = Vec::new();
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }

    #[derive(Debug, Copy, Clone, PartialOrd, PartialEq, Hash, Ord, Eq)]
    pub struct BytesDeserialize<T>(pub T);

    impl<'de, T> Deserialize<'de> for BytesDeserialize<T>
    where
        T: From<Vec<u8>>,
    {
        fn deserialize<D>(deserializer: D) -> Result<Self, D::Error>
        where
            D: serde::Deserializer<'de>,
        {
            Ok(Self(deserializer.deserialize_any(Base64Visitor)?.into()))
        }
    }

    /// An enum field as `jsonpb` reads it: the name of one of the enum's
    /// values, or any number that fits an `int32` (a value the enum does
    /// not know is kept, as protobuf keeps it). The generated code reads
    /// enum fields through this (`retcd-api`'s build script rewrites it).
    #[derive(Debug, Copy, Clone, PartialEq, Eq)]
    pub struct OpenEnum<T>(pub i32, std::marker::PhantomData<T>);

    struct OpenEnumVisitor<T>(std::marker::PhantomData<T>);

    impl<'de, T> Visitor<'de> for OpenEnumVisitor<T>
    where
        T: Deserialize<'de> + Into<i32>,
    {
        type Value = i32;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("an enum value's name or an int32")
        }

        fn visit_str<E>(self, v: &str) -> Result<i32, E>
        where
            E: serde::de::Error,
        {
            let de = serde::de::value::StrDeserializer::<'_, E>::new(v);
            T::deserialize(de).map(Into::into)
        }

        fn visit_i64<E>(self, v: i64) -> Result<i32, E>
        where
            E: serde::de::Error,
        {
            i32::try_from(v).map_err(|_| E::custom(format!("cannot unmarshal number {v} into an enum")))
        }

        fn visit_u64<E>(self, v: u64) -> Result<i32, E>
        where
            E: serde::de::Error,
        {
            i32::try_from(v).map_err(|_| E::custom(format!("cannot unmarshal number {v} into an enum")))
        }

        /// `null` (an element of a repeated enum: Go leaves it 0).
        fn visit_unit<E>(self) -> Result<i32, E>
        where
            E: serde::de::Error,
        {
            Ok(0)
        }

        /// serde_json reads `-0` as a float; Go reads it as 0 (and refuses
        /// `1.0` or `1e0` for an integer).
        fn visit_f64<E>(self, v: f64) -> Result<i32, E>
        where
            E: serde::de::Error,
        {
            if v == 0.0 && v.is_sign_negative() {
                Ok(0)
            } else {
                Err(E::custom(format!("cannot unmarshal number {v} into an enum")))
            }
        }
    }

    impl<'de, T> Deserialize<'de> for OpenEnum<T>
    where
        T: Deserialize<'de> + Into<i32>,
    {
        fn deserialize<D>(deserializer: D) -> Result<Self, D::Error>
        where
            D: serde::Deserializer<'de>,
        {
            let v = deserializer.deserialize_any(OpenEnumVisitor::<T>(std::marker::PhantomData))?;
            Ok(Self(v, std::marker::PhantomData))
        }
    }

    /// An enum field as `jsonpb` writes it: a known value by its name, any
    /// other number as a bare number.
    #[derive(Debug)]
    pub struct OpenEnumValue<T>(pub Result<T, i32>);

    impl<T: serde::Serialize> serde::Serialize for OpenEnumValue<T> {
        fn serialize<S>(&self, serializer: S) -> Result<S::Ok, S::Error>
        where
            S: serde::Serializer,
        {
            match &self.0 {
                Ok(known) => known.serialize(serializer),
                Err(n) => serializer.serialize_i32(*n),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use serde::de::value::{BorrowedStrDeserializer, Error};

        fn bytes(s: &str) -> Result<Vec<u8>, Error> {
            BytesDeserialize::deserialize(BorrowedStrDeserializer::<'_, Error>::new(s)).map(|b| b.0)
        }

        fn int(s: &str) -> Result<i64, Error> {
            NumberDeserialize::deserialize(BorrowedStrDeserializer::<'_, Error>::new(s)).map(|n| n.0)
        }

        #[test]
        fn test_bytes_as_go_reads_them() {
            assert_eq!(bytes("dg==").unwrap(), b"v");
            assert_eq!(bytes("enp=").unwrap(), b"zz", "unused bits set");
            assert_eq!(bytes("dg==\n").unwrap(), b"v");
            assert_eq!(bytes("d\r\ng==").unwrap(), b"v");
            assert_eq!(bytes("").unwrap(), b"");
            for refused in ["dg", "dg=", "-_8=", "dg===", " dg==", "!!"] {
                assert!(bytes(refused).is_err(), "{refused:?}");
            }
        }

        #[test]
        fn test_quoted_numbers_as_go_reads_them() {
            assert_eq!(int("1").unwrap(), 1);
            assert_eq!(int(" 1").unwrap(), 1);
            assert_eq!(int("1 ").unwrap(), 1);
            assert_eq!(int("-7").unwrap(), -7);
            assert_eq!(int("0").unwrap(), 0);
            assert_eq!(int("-0").unwrap(), 0);
            assert_eq!(int("null").unwrap(), 0);
            for refused in ["+1", "01", "-01", "", "1.0", "1e3", "x", "-"] {
                assert!(int(refused).is_err(), "{refused:?}");
            }
        }
    }
}
