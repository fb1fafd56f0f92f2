//! Compile-time behaviour of `#[derive(Payload)]` and `#[montage::logged]`: every rejected definition fails with the
//! error text checked in beside it (`tests/ui/fail/*.stderr`), and the accepted ones
//! compile and run. Regenerate the expected text with `cargo xtask ui --bless`.

#[test]
fn derive_payload() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
