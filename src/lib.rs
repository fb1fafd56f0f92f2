#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

pub use montage_core::*;
