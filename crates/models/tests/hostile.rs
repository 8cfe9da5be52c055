//! Lying safetensors headers and random bytes: always a typed error, never a panic.

use models::{Architecture, Checkpoint, WeightsError};
use proptest::prelude::*;

fn open_bytes(bytes: &[u8]) -> Result<Checkpoint, WeightsError> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    Checkpoint::open(dir.path(), Architecture::Llama)
}

fn with_header(header: &str, data: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + data, 0);
    out
}

#[test]
fn offsets_near_usize_max_are_corrupt_not_an_overflow() {
    let max = usize::MAX;
    let header = format!(r#"{{"a":{{"dtype":"U8","shape":[{max}],"data_offsets":[0,{max}]}}}}"#);
    let r = open_bytes(&with_header(&header, 4));
    assert!(matches!(r, Err(WeightsError::Corrupt { .. })), "{r:?}");
}

#[test]
fn lying_headers_are_corrupt() {
    let cases = [
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}}"#,
        r#"[1,2]"#,
        r#"not json"#,
    ];
    for header in cases {
        let r = open_bytes(&with_header(header, 8));
        assert!(
            matches!(r, Err(WeightsError::Corrupt { .. })),
            "{header}: {r:?}"
        );
    }
    let mut huge = with_header("{}", 0);
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        open_bytes(&huge),
        Err(WeightsError::Corrupt { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = open_bytes(&bytes);
    }

    #[test]
    fn random_headers_never_panic(
        header in "\\{(\"[a-c]\":\\{\"dtype\":\"(F32|BF16|U8|I64)\",\"shape\":\\[[0-9]{0,20}(,[0-9]{0,20})?\\],\"data_offsets\":\\[[0-9]{0,20},[0-9]{0,20}\\]\\},?){0,3}\\}",
        data in 0usize..64,
    ) {
        let _ = open_bytes(&with_header(&header, data));
    }
}

/// A valid tiny GPT-2 `model.safetensors` (one 2x3 F32 tensor and one bias).
fn valid_file() -> Vec<u8> {
    let header = r#"{"wte.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"ln_f.bias":{"dtype":"F32","shape":[3],"data_offsets":[24,36]}}"#;
    with_header(header, 36)
}

#[test]
fn the_valid_file_opens() {
    let ckpt = open_bytes(&valid_file()).unwrap();
    assert_eq!(ckpt.tensor_f32("wte.weight").unwrap(), vec![0.0; 6]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Overwrite one byte (header length, header text or data) and truncate: no panic, and
    /// whatever opens still reads every tensor within bounds.
    #[test]
    fn mutated_valid_files_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>(),
                                       cut in any::<prop::sample::Index>()) {
        let mut bytes = valid_file();
        let i = pos.index(bytes.len());
        bytes[i] = byte;
        bytes.truncate(bytes.len() - cut.index(4));
        if let Ok(ckpt) = open_bytes(&bytes) {
            let names: Vec<String> = ckpt.names().map(str::to_string).collect();
            for name in names {
                let _ = ckpt.tensor_f32(&name);
            }
        }
    }
}
