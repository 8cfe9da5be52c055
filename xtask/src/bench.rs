pub fn run(_t: bool) -> anyhow::Result<()> { anyhow::bail!("not yet") }
