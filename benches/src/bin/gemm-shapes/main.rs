//! `gemm-shapes`: GFLOP/s of the CPU backend's SGEMM on the tiny GPT's matrix shapes (one
//! training step's forward and backward products) and on square sizes, on rayon's pool (2
//! threads by default; `RAYON_NUM_THREADS` sets it). `--compare` times the `gemm` crate and the
//! own AVX2 kernel on each shape, calls alternating, and prints both with their ratio.

use benches::median;
use clap::Parser;
use gpu_core::cpu::{self, SgemmPath};
use gpu_core::MatmulSpec;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "SGEMM GFLOP/s on the GPT's shapes and square sizes")]
struct Args {
    /// The CPU mode (the automatic path takes the own kernel only in the fast mode).
    #[arg(long, default_value = "fast", value_parser = parse_mode)]
    cpu_mode: cpu::CpuMode,
    /// Time the crate and the own kernel, alternating, instead of the automatic path.
    #[arg(long)]
    compare: bool,
    /// Square sizes n (n × n × n) after the GPT's shapes.
    #[arg(long, value_delimiter = ',', default_value = "256,512,1024")]
    sizes: Vec<usize>,
    /// Skip the GPT's shapes.
    #[arg(long)]
    no_gpt: bool,
    /// Seconds of timed calls per shape and path (at least 5 calls).
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
}

fn parse_mode(s: &str) -> Result<cpu::CpuMode, String> {
    cpu::CpuMode::parse(s).ok_or_else(|| format!("'{s}': expected fast or exact"))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    cpu::set_mode(args.cpu_mode);
    // (m, n, k, trans_a, trans_b): forward x·Wᵀ, backward g·W and gᵀ·x, per GPT linear layer.
    let mut shapes = Vec::new();
    if !args.no_gpt {
        for (o, i) in [(384, 128), (128, 128), (512, 128), (128, 512), (65, 128)] {
            shapes.push((768, o, i, false, true));
            shapes.push((768, i, o, false, false));
            shapes.push((o, i, 768, true, false));
        }
    }
    for &n in &args.sizes {
        shapes.push((n, n, n, false, false));
    }
    let paths: &[SgemmPath] = if args.compare {
        &[SgemmPath::Crate, SgemmPath::Own]
    } else {
        &[SgemmPath::Auto]
    };
    let mut total = vec![0.0; paths.len()];
    for (m, n, k, ta, tb) in shapes {
        let spec = MatmulSpec {
            batch: 1,
            m,
            n,
            k,
            trans_a: ta,
            trans_b: tb,
        };
        let data = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
                .collect()
        };
        let (a, b) = (data(m * k), data(k * n));
        let mut c = vec![0.0f32; m * n];
        let reps = (args.seconds * 1e11 / spec.flops()).clamp(5.0, 5000.0) as usize;
        for &p in paths {
            for _ in 0..3 {
                cpu::sgemm_with(p, spec, &a, &b, &mut c)?;
            }
        }
        let mut t = vec![Vec::with_capacity(reps); paths.len()];
        for _ in 0..reps {
            for (i, &p) in paths.iter().enumerate() {
                let t0 = Instant::now();
                cpu::sgemm_with(p, spec, &a, &b, &mut c)?;
                t[i].push(t0.elapsed().as_secs_f64());
            }
        }
        let s: Vec<f64> = t.iter().map(|v| median(v)).collect();
        let gpt = m == 768 || n == 128 || k == 768;
        let mut line = format!("{m:5} x {n:4} x {k:4} ta={ta:<5} tb={tb:<5}");
        for (i, p) in paths.iter().enumerate() {
            if gpt {
                total[i] += s[i];
            }
            line += &format!(
                "  {p:?} {:8.1} us {:6.1} GFLOP/s",
                s[i] * 1e6,
                spec.flops() / s[i] / 1e9
            );
        }
        if args.compare {
            line += &format!("  own/crate speed {:.2}", s[0] / s[1]);
        }
        println!("{line}");
    }
    for (i, p) in paths.iter().enumerate() {
        println!(
            "GPT-shape products, one per layer kind, {p:?}: {:.2} ms",
            total[i] * 1e3
        );
    }
    Ok(())
}
