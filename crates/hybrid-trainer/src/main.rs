//! The `hybrid-trainer` command line. With no subcommand it runs the main job (a char-level GPT
//! trained by the hybrid trainer on the embedded corpus) on the default device.

use anyhow::Result;
use clap::{Parser, Subcommand};
use gpu_core::Device;

#[derive(Parser)]
#[command(
    name = "hybrid-trainer",
    version,
    about = "Hybrid predictive trainer on NVIDIA GPUs with an exact CPU fallback"
)]
struct Cli {
    /// The main job's flags (used when no subcommand is given; `run` takes the same).
    #[command(flatten)]
    job: hybrid_trainer::job::JobArgs,
    /// Device: auto (GPU when present, else CPU), cpu, cuda or cuda:N. Overrides $HYBRID_DEVICE.
    #[arg(long, global = true, default_value = "auto", value_parser = parse_device)]
    device: DeviceChoice,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// The main job (the default): see the top-level flags.
    Run(hybrid_trainer::job::JobArgs),
    /// The hybrid against AdamW and three controls over several seeds; writes docs/results.md.
    Experiment(hybrid_trainer::experiment::ExperimentArgs),
    /// Device info, memory round trip, 2×2 and N×N matmul checked against references, GFLOP/s.
    Demo {
        /// Matrix size of the timed product.
        #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=16384))]
        size: u32,
    },
    /// Train the GPT of tensor-ops on a text file (nanoGPT's shakespeare-char setup by default).
    TrainGpt(hybrid_trainer::train_gpt::TrainArgs),
    /// Write a small model's weights, inputs, outputs and gradients for a PyTorch replay:
    /// the GPT for scripts/torch_parity.py, the GRU cell for scripts/torch_gru_parity.py.
    ParityDump {
        #[arg(long)]
        out: std::path::PathBuf,
        /// gpt or gru.
        #[arg(long, default_value = "gpt", value_parser = ["gpt", "gru"])]
        model: String,
        /// The GPT's variant: gpt2 or llama.
        #[arg(long, default_value = "gpt2", value_parser = hybrid_trainer::train_gpt::parse_variant)]
        variant: tensor_ops::gpt::Variant,
    },
}

#[derive(Clone, Copy)]
enum DeviceChoice {
    Auto,
    Fixed(Device),
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        Ok(DeviceChoice::Auto)
    } else {
        s.parse::<Device>()
            .map(DeviceChoice::Fixed)
            .map_err(|e| e.to_string())
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let device = match cli.device {
        DeviceChoice::Auto => {
            let d = Device::auto()?;
            gpu_core::device::describe_choice(d);
            d
        }
        DeviceChoice::Fixed(d) => {
            d.check_present()?;
            println!("device {d} (--device)");
            d
        }
    };
    match cli.cmd.unwrap_or(Cmd::Run(cli.job)) {
        Cmd::Run(args) => {
            hybrid_trainer::job::run(device, &args)?;
        }
        Cmd::Experiment(args) => {
            hybrid_trainer::experiment::run(device, &args)?;
        }
        Cmd::Demo { size } => {
            hybrid_trainer::demo::run(device, size as usize)?;
        }
        Cmd::ParityDump {
            out,
            model,
            variant,
        } => {
            if model == "gru" {
                hybrid_trainer::parity_gru::dump(device, &out)?;
            } else {
                hybrid_trainer::parity::dump(device, variant, &out)?;
            }
        }
        Cmd::TrainGpt(args) => {
            hybrid_trainer::train_gpt::run(device, &args)?;
        }
    }
    Ok(())
}
