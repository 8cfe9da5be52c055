//! Tests of the run records and their reports: spans, best val, JSON round trip with
//! non-finite losses, markdown content and the three files (PNG checked by header and decoding).

use super::*;

fn step(step: u64, kind: StepKind, loss: Option<f32>) -> StepPoint {
    StepPoint { step, kind, loss }
}

fn with_kinds(kinds: &[StepKind]) -> RunRecord {
    let steps = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| step(i as u64, k, None))
        .collect();
    RunRecord {
        steps,
        ..RunRecord::default()
    }
}

/// A unique, fresh directory under the system temp dir.
fn temp_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "hybrid-trainer-report-{name}-{}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Checks the PNG signature and IHDR size, then decodes it; returns the non-white pixels.
fn check_png(path: &Path, width: u32, height: u32) -> usize {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&bytes[12..16], b"IHDR");
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), width);
    assert_eq!(
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
        height
    );
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (width, height));
    buf[..info.buffer_size()]
        .chunks(3)
        .filter(|px| px != &[255, 255, 255])
        .count()
}

fn sample() -> RunRecord {
    use StepKind::*;
    let kinds = [
        Warmup, Warmup, Full, Full, Predicted, Predicted, Predicted, Correct, Full, Predicted,
        Predicted, Correct,
    ];
    let steps = kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            let loss = (k != Predicted).then_some(4.0 - 0.2 * i as f32);
            step(i as u64, k, loss)
        })
        .collect();
    RunRecord {
        title: "hybrid, seed 1337".into(),
        mode: "hybrid".into(),
        device: "cpu".into(),
        corpus: crate::corpus::DEFAULT_CORPUS_NAME.into(),
        config: serde_json::json!({ "lr": 3e-4, "horizon": 3 }),
        steps,
        evals: vec![
            EvalPoint {
                step: 0,
                train: 4.2,
                val: 4.25,
            },
            EvalPoint {
                step: 6,
                train: 3.1,
                val: 3.0,
            },
            EvalPoint {
                step: 11,
                train: 2.9,
                val: 3.05,
            },
        ],
        counters: Counters {
            steps: 12,
            forward_passes: 7,
            backward_passes: 7,
            predicted_steps: 5,
            rollbacks: 1,
            wall_seconds: 1.5,
        },
        notes: vec!["rollback at step 8: val loss rose".into()],
    }
}

#[test]
fn predicted_spans_on_hand_built_cases() {
    use StepKind::*;
    assert!(with_kinds(&[]).predicted_spans().is_empty());
    assert!(with_kinds(&[Warmup, Full, Correct])
        .predicted_spans()
        .is_empty());
    let at_start = with_kinds(&[Predicted, Predicted, Full, Full]);
    assert_eq!(at_start.predicted_spans(), vec![(0, 2)]);
    let at_end = with_kinds(&[Warmup, Full, Predicted, Predicted, Predicted]);
    assert_eq!(at_end.predicted_spans(), vec![(2, 5)]);
    let all = with_kinds(&[Predicted; 4]);
    assert_eq!(all.predicted_spans(), vec![(0, 4)]);
    let adjacent = with_kinds(&[Predicted, Correct, Predicted, Predicted, Full, Predicted]);
    assert_eq!(adjacent.predicted_spans(), vec![(0, 1), (2, 4), (5, 6)]);
    // A gap in the step numbers ends a span.
    let gap = RunRecord {
        steps: vec![
            step(10, Predicted, None),
            step(11, Predicted, None),
            step(13, Predicted, None),
        ],
        ..RunRecord::default()
    };
    assert_eq!(gap.predicted_spans(), vec![(10, 12), (13, 14)]);
}

#[test]
fn best_val_is_lowest_finite_and_earliest_on_ties() {
    let mut rec = RunRecord::default();
    assert_eq!(rec.best_val(), None);
    rec.evals = vec![EvalPoint {
        step: 0,
        train: 1.0,
        val: f32::NAN,
    }];
    assert_eq!(rec.best_val(), None);
    rec.evals = [(0, 3.0), (10, 2.0), (20, f32::NAN), (30, 2.0), (40, 2.5)]
        .iter()
        .map(|&(step, val)| EvalPoint {
            step,
            train: val,
            val,
        })
        .collect();
    assert_eq!(rec.best_val(), Some((10, 2.0)));
    assert_eq!(sample().best_val(), Some((6, 3.0)));
}

#[test]
fn write_report_writes_markdown_json_and_png() {
    let dir = temp_dir("write").join("nested");
    let rec = sample();
    let paths = write_report(&dir, "hybrid-1337", &rec).unwrap();
    assert_eq!(paths.png, dir.join("hybrid-1337.png"));
    let md = std::fs::read_to_string(&paths.markdown).unwrap();
    assert_eq!(md, markdown(&rec, "hybrid-1337.png"));
    assert!(md.contains("](hybrid-1337.png)"));
    let back: RunRecord =
        serde_json::from_str(&std::fs::read_to_string(&paths.json).unwrap()).unwrap();
    assert_eq!(back, rec);
    assert!(check_png(&paths.png, 1200, 700) > 10_000);
    std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}

#[test]
fn json_round_trips_and_non_finite_losses_become_null() {
    let mut rec = sample();
    rec.steps[0].loss = Some(f32::NAN);
    rec.steps[1].loss = Some(f32::INFINITY);
    rec.evals[1].val = f32::NEG_INFINITY;
    rec.counters.wall_seconds = f64::NAN;
    let json = serde_json::to_string(&rec).unwrap();
    let back: RunRecord = serde_json::from_str(&json).unwrap();
    // Step losses: null reads back as None; eval values and wall-clock as NaN.
    assert_eq!(back.steps[0].loss, None);
    assert_eq!(back.steps[1].loss, None);
    assert!(back.evals[1].val.is_nan());
    assert!(back.counters.wall_seconds.is_nan());
    let mut expected = rec.clone();
    expected.steps[0].loss = None;
    expected.steps[1].loss = None;
    expected.evals[1].val = 0.0;
    expected.counters.wall_seconds = 0.0;
    let mut got = back;
    got.evals[1].val = 0.0;
    got.counters.wall_seconds = 0.0;
    assert_eq!(got, expected);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(value["steps"][0]["loss"].is_null());
    assert_eq!(value["steps"][0]["kind"], "warmup");
    assert!(value["evals"][1]["val"].is_null());
}

#[test]
fn markdown_mentions_counters_spans_and_notes() {
    let md = markdown(&sample(), "run.png");
    for needle in [
        "# hybrid, seed 1337",
        "| steps | 12 |",
        "| forward passes | 7 |",
        "| backward passes | 7 |",
        "| predicted steps | 5 |",
        "| rollbacks | 1 |",
        "| wall-clock | 1.5 s |",
        "| backward passes saved (vs one per step) | 41.7 % |",
        "final val loss: 3.0500 (step 11)",
        "best val loss: 3.0000 (step 6)",
        "| 6 | 3.1000 | 3.0000 |",
        "2 spans, 5 predicted steps in all, longest 3 steps ([4, 7))",
        "- rollback at step 8: val loss rose",
        "\"horizon\": 3",
        "![loss curves](run.png)",
        "tinyshakespeare (embedded)",
    ] {
        assert!(md.contains(needle), "missing {needle:?} in\n{md}");
    }
    assert!(!md.contains("non-finite"));
}

#[test]
fn degenerate_records_report_without_panicking() {
    let dir = temp_dir("degenerate");
    let empty = RunRecord::default();
    let md = markdown(&empty, "e.png");
    assert!(md.contains("final val loss: n/a") && md.contains("| backward passes saved"));
    write_report(&dir, "empty", &empty).unwrap();
    check_png(&dir.join("empty.png"), 1200, 700);

    let none = with_kinds(&[StepKind::Predicted; 3]);
    write_report(&dir, "none", &none).unwrap();
    check_png(&dir.join("none.png"), 1200, 700);

    let mut bad = sample();
    bad.steps[0].loss = Some(f32::NAN);
    bad.steps[2].loss = Some(f32::INFINITY);
    bad.evals[0].train = f32::NAN;
    let md = markdown(&bad, "bad.png");
    assert!(md.contains("non-finite losses (NaN/inf, skipped in the plot): 3"));
    assert!(md.contains("| 0 | NaN | 4.2500 |"));
    write_report(&dir, "bad", &bad).unwrap();
    check_png(&dir.join("bad.png"), 1200, 700);

    let single = RunRecord {
        steps: vec![step(5, StepKind::Full, Some(2.0))],
        evals: vec![EvalPoint {
            step: 5,
            train: 2.0,
            val: 2.0,
        }],
        ..RunRecord::default()
    };
    write_report(&dir, "single", &single).unwrap();
    check_png(&dir.join("single.png"), 1200, 700);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plot_curves_writes_valid_png_for_empty_and_nan_curves() {
    let dir = temp_dir("curves");
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.png");
    plot_curves(&empty, "no curves", "step", "val loss", &[]).unwrap();
    check_png(&empty, 1200, 700);
    let curves = [
        Curve {
            label: "baseline".into(),
            points: vec![(0.0, 4.2), (100.0, f64::NAN), (200.0, 2.0), (300.0, 1.8)],
        },
        Curve {
            label: "hybrid".into(),
            points: vec![(0.0, 4.2), (f64::INFINITY, 1.0), (300.0, 1.7)],
        },
        Curve {
            label: "all NaN".into(),
            points: vec![(1.0, f64::NAN)],
        },
        Curve {
            label: "empty".into(),
            points: vec![],
        },
    ];
    let path = dir.join("arms.png");
    plot_curves(&path, "validation loss", "step", "val loss", &curves).unwrap();
    assert!(check_png(&path, 1200, 700) > 10_000);
    let nan_only = dir.join("nan.png");
    plot_curves(&nan_only, "nan", "x", "y", &curves[2..]).unwrap();
    check_png(&nan_only, 1200, 700);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plot_run_errors_name_an_unwritable_path() {
    let dir = temp_dir("missing-dir");
    let path = dir.join("run.png");
    let err = plot_run(&path, &sample()).unwrap_err();
    assert!(format!("{err:#}").contains(&path.display().to_string()));
}
