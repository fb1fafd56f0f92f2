//! Values of serde types in the ready structures (`montage_core::payload::Serde`): they
//! survive a close and reopen, a structure opened with a changed type is refused and left as
//! it was, and a value or a type postcard cannot store is refused with a typed error that
//! writes nothing.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use montage_collections::{HashMap, Queue, SortedMap};
use montage_core::payload::Serde;
use montage_core::{Error, Heap, HeapConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Role {
    Reader,
    Writer { quota: u64 },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct User {
    name: String,
    roles: Vec<Role>,
    settings: BTreeMap<String, String>,
    home: Option<PathBuf>,
}

fn user(i: u64) -> User {
    User {
        name: format!("user-{i}"),
        roles: if i.is_multiple_of(2) {
            vec![Role::Reader]
        } else {
            vec![Role::Reader, Role::Writer { quota: i * 10 }]
        },
        settings: BTreeMap::from([("theme".to_owned(), format!("t{}", i % 3))]),
        home: i
            .is_multiple_of(5)
            .then(|| PathBuf::from(format!("/home/{i}"))),
    }
}

/// The same type as a later version of the program has it: a field added.
mod changed {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub(super) enum Role {
        Reader,
        Writer { quota: u64 },
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub(super) struct User {
        pub(super) name: String,
        pub(super) roles: Vec<Role>,
        pub(super) settings: BTreeMap<String, String>,
        pub(super) home: Option<PathBuf>,
        pub(super) email: String,
    }
}

#[test]
fn serde_values_survive_a_reopen_and_a_changed_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("serde.heap")).size(8 << 20);
    let heap = Heap::create(&config).unwrap();
    {
        let users = HashMap::<String, Serde<User>>::open(&heap, "users").unwrap();
        let by_id = SortedMap::<u64, Serde<User>>::open(&heap, "by-id").unwrap();
        let log = Queue::<Serde<(u64, Role)>>::open(&heap, "log").unwrap();
        for i in 0..500 {
            users.insert(format!("user-{i}"), Serde(user(i))).unwrap();
            by_id.insert(i, Serde(user(i))).unwrap();
            log.push_back(Serde((i, Role::Writer { quota: i })))
                .unwrap();
        }
        // A path that is no UTF-8 has no encoding: refused, and nothing changes.
        let mut bad = user(7);
        bad.home = Some(PathBuf::from(OsStr::from_bytes(b"/home/\xff")));
        let refused = users.insert("user-7".to_owned(), Serde(bad));
        assert!(matches!(refused, Err(Error::Encode { .. })), "{refused:?}");
        assert_eq!(
            users.get(&"user-7".to_owned()).unwrap(),
            Some(Serde(user(7)))
        );
    }
    heap.close().unwrap();

    let heap = Heap::open(&config).unwrap();
    // A changed type: refused, and the heap keeps what it holds.
    let refused = HashMap::<String, Serde<changed::User>>::open(&heap, "users");
    assert!(
        matches!(refused, Err(Error::LayoutMismatch { .. })),
        "{refused:?}"
    );
    let users = HashMap::<String, Serde<User>>::open(&heap, "users").unwrap();
    let by_id = SortedMap::<u64, Serde<User>>::open(&heap, "by-id").unwrap();
    let log = Queue::<Serde<(u64, Role)>>::open(&heap, "log").unwrap();
    assert_eq!(users.len(), 500);
    for i in 0..500 {
        assert_eq!(
            users.get(&format!("user-{i}")).unwrap(),
            Some(Serde(user(i)))
        );
        assert_eq!(by_id.get(&i).unwrap(), Some(Serde(user(i))));
        assert_eq!(
            log.pop_front().unwrap(),
            Some(Serde((i, Role::Writer { quota: i })))
        );
    }
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(untagged)]
enum Loose {
    Number(u64),
    Text(String),
}

#[test]
fn a_type_postcard_cannot_store_is_refused_when_the_structure_opens() {
    let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
    let refused = HashMap::<u64, Serde<Loose>>::open(&heap, "loose");
    match refused {
        Err(Error::Encode { type_name, why }) => {
            assert!(type_name.contains("Loose"), "{type_name}");
            assert!(why.contains("cannot be traced"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // Nothing was created: the name is still free for a structure of another type.
    HashMap::<u64, u64>::open(&heap, "loose").unwrap();
}
