//! Wire compatibility with the previous release, both ways: its agents report to this
//! controller, and this agent reports to its controller (the skew policy: one minor version
//! either way, docs/upgrading.md). `previous/` holds agent.proto as the previous release
//! shipped it (refreshed at each release, RELEASING.md).
//!
//! Every message of the previous file is filled (every field set, nested messages too), encoded
//! with the previous schema and read with this build's types; and every message of this file is
//! filled, encoded with this schema and read with the previous one. Each field both know keeps
//! its value, and no field number changes meaning.

use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, Kind, MapKey, MessageDescriptor, Value};

fn pool(dir: &str) -> DescriptorPool {
    let files = protox::compile(["sked/agent/v1/agent.proto"], [dir])
        .unwrap_or_else(|e| panic!("{dir}/sked/agent/v1/agent.proto does not compile: {e}"));
    DescriptorPool::from_file_descriptor_set(files).unwrap_or_else(|e| panic!("descriptors of {dir}: {e}"))
}

fn previous() -> DescriptorPool {
    pool(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/previous"))
}

fn current() -> DescriptorPool {
    pool(env!("CARGO_MANIFEST_DIR"))
}

/// A value for every field of `message`, nested messages filled to `depth`; each scalar is
/// told apart by its field number, so a field read under another number shows.
fn filled(message: &MessageDescriptor, depth: usize) -> DynamicMessage {
    let mut m = DynamicMessage::new(message.clone());
    for field in message.fields() {
        let n = field.number();
        let value = match field.kind() {
            Kind::Message(_) if depth == 0 => continue,
            Kind::Message(entry) if field.is_map() => {
                // One entry: the entry message's key (field 1) and value (field 2).
                let one = filled(&entry, depth - 1);
                let key = match one.get_field_by_number(1).map(|k| k.into_owned()) {
                    Some(Value::String(k)) => MapKey::String(k),
                    Some(Value::U64(k)) => MapKey::U64(k),
                    Some(Value::I64(k)) => MapKey::I64(k),
                    Some(Value::U32(k)) => MapKey::U32(k),
                    Some(Value::I32(k)) => MapKey::I32(k),
                    Some(Value::Bool(k)) => MapKey::Bool(k),
                    other => panic!("{}: a map key of {other:?}", field.name()),
                };
                let value = one.get_field_by_number(2).map(|v| v.into_owned()).unwrap_or(Value::Bool(false));
                m.set_field(&field, Value::Map(std::collections::HashMap::from([(key, value)])));
                continue;
            }
            Kind::Message(inner) => Value::Message(filled(&inner, depth - 1)),
            Kind::String => Value::String(format!("{}-{n}", field.name())),
            Kind::Bytes => Value::Bytes(vec![n as u8; 3].into()),
            Kind::Bool => Value::Bool(true),
            Kind::Double => Value::F64(f64::from(n) + 0.5),
            Kind::Float => Value::F32(n as f32 + 0.5),
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(i32::try_from(n).unwrap_or(1) * 7),
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(i64::from(n) * 1_000_003),
            Kind::Uint32 | Kind::Fixed32 => Value::U32(n * 11),
            Kind::Uint64 | Kind::Fixed64 => Value::U64(u64::from(n) * 1_000_033),
            Kind::Enum(e) => Value::EnumNumber(e.values().last().map_or(0, |v| v.number())),
        };
        let value = if field.is_list() { Value::List(vec![value.clone(), value]) } else { value };
        m.set_field(&field, value);
    }
    m
}

/// Encodes a filled `name` of `from`, reads it as `name` of `to`, and checks each field both
/// schemas have kept its value.
fn read_across(from: &DescriptorPool, to: &DescriptorPool, name: &str) {
    let (Some(written), Some(reader)) = (from.get_message_by_name(name), to.get_message_by_name(name)) else {
        panic!("{name} is in one schema and not the other: a message is never removed");
    };
    let sent = filled(&written, 3);
    let read = DynamicMessage::decode(reader.clone(), sent.encode_to_vec().as_slice())
        .unwrap_or_else(|e| panic!("{name} written by one version is unreadable by the other: {e}"));
    for field in reader.fields() {
        let Some(was) = written.get_field(field.number()) else { continue };
        match (field.kind(), was.kind()) {
            (Kind::Message(_), Kind::Message(_)) => {
                // Compared field by field through its own call below.
            }
            _ => assert!(
                read.get_field(&field).into_owned() == sent.get_field(&was).into_owned(),
                "{name}.{} (field {}) changed on the way",
                field.name(),
                field.number()
            ),
        }
    }
}

#[test]
fn no_field_number_changes_name_type_or_cardinality() {
    let (previous, current) = (previous(), current());
    for old in previous.all_messages() {
        let new = current
            .get_message_by_name(old.full_name())
            .unwrap_or_else(|| panic!("{} was removed: a message is never removed", old.full_name()));
        for field in old.fields() {
            let Some(now) = new.get_field(field.number()) else {
                panic!(
                    "{}.{} (field {}) was removed: reserve its number instead",
                    old.name(),
                    field.name(),
                    field.number()
                )
            };
            assert_eq!(now.name(), field.name(), "{}: field {} renamed", old.name(), field.number());
            assert_eq!(
                format!("{:?}", now.kind()).split('(').next(),
                format!("{:?}", field.kind()).split('(').next(),
                "{}.{}: its type changed",
                old.name(),
                field.name()
            );
            assert_eq!(
                now.cardinality(),
                field.cardinality(),
                "{}.{}: repeated or not changed",
                old.name(),
                field.name()
            );
        }
    }
    for old in previous.all_enums() {
        let new =
            current.get_enum_by_name(old.full_name()).unwrap_or_else(|| panic!("{} was removed", old.full_name()));
        for value in old.values() {
            let now = new
                .get_value(value.number())
                .unwrap_or_else(|| panic!("{}: value {} removed", old.name(), value.name()));
            assert_eq!(now.name(), value.name(), "{}: value {} renamed", old.name(), value.number());
        }
    }
}

#[test]
fn the_previous_agents_messages_read_here_and_ours_read_there() {
    let (previous, current) = (previous(), current());
    for message in previous.all_messages() {
        // The previous release's agent (or controller) writes, this build reads...
        read_across(&previous, &current, message.full_name());
        // ...and this build writes every field it has, the previous release reads.
        read_across(&current, &previous, message.full_name());
    }
}

#[test]
fn this_builds_types_keep_what_the_previous_agent_sent() {
    // The generated types, not only the schema: a previous Report read and written again by
    // this build (as the controller's table and relays do) reads back the same.
    let previous = previous();
    let report = previous.get_message_by_name("sked.agent.v1.Report").unwrap_or_else(|| panic!("no Report"));
    let sent = filled(&report, 3);
    let ours = sked_proto::Report::decode(sent.encode_to_vec().as_slice()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ours.node, "node-1");
    let again = DynamicMessage::decode(report, ours.encode_to_vec().as_slice()).unwrap_or_else(|e| panic!("{e}"));
    assert!(again.encode_to_vec() == sent.encode_to_vec(), "a previous Report through this build's types changed");
}
