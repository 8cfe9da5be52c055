//! The NN operation families of `gpu_core::nn` on CUDA, one file per family, each launching the
//! kernels of `kernels/nn_<family>.cu`.

pub(crate) mod attention;
mod attention_bf16;
mod decode;
mod elementwise;
mod multi_tensor;
mod optim;
mod optim_adaptive;
pub(crate) mod quant;
mod rows;
mod sample;
mod world;
mod world_svd;
mod world_svd_graph;

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every kernel name written as a string literal (`"…_f32"`) in this crate's sources, outside
    /// comments.
    fn literal_kernel_names(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                literal_kernel_names(&path, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                let mut rest = line;
                while let Some(start) = rest.find('"') {
                    let after = &rest[start + 1..];
                    let Some(end) = after.find('"') else { break };
                    let lit = &after[..end];
                    if lit.ends_with("_f32")
                        && !lit.starts_with('_')
                        && lit
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    {
                        out.push((lit.to_string(), path.display().to_string()));
                    }
                    rest = &after[end + 1..];
                }
            }
        }
    }

    /// A kernel name with no kernel fails here, on any machine with the sources, instead of at
    /// the first launch. (A test binary carried to another machine, as the GPU bundle is, finds
    /// no sources: it says so and checks nothing there; CI runs it where they are.)
    #[test]
    fn every_kernel_name_in_the_sources_exists() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        // The file holding this test: a stray directory of that name (a partial copy on
        // another machine) is not the sources.
        if !src.join("nn").join("mod.rs").is_file() {
            eprintln!("SKIP every_kernel_name_in_the_sources_exists: no sources at {src:?}");
            return;
        }
        let mut names = Vec::new();
        literal_kernel_names(&src, &mut names);
        assert!(names.len() >= 25, "found only {} kernel names", names.len());
        for (name, file) in names {
            assert!(
                gpu_kernels::module_of(&name).is_some(),
                "{file} names kernel {name}, which no embedded module defines"
            );
        }
    }
}
