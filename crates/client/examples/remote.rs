//! A remote actor and learner in Rust: write an episode, sample it, update priorities.
//!
//!     reprise serve --config reprise.toml          # or rp.Server(tables, address="127.0.0.1:7070")
//!     cargo run --release -p reprise-client --example remote -- 127.0.0.1:7070 [token]
//!
//! Steps are raw little-endian rows, one column per field in signature order
//! (`RemoteClient::row_bytes`); here every field is filled with the step number's bytes.

use reprise_client::{RemoteClient, RemoteOptions, ReplayClient, StepWriter};
use reprise_core::Wait;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let address = args.next().unwrap_or_else(|| "127.0.0.1:7070".into());
    let token = args.next();
    let client = RemoteClient::connect(&address, RemoteOptions { token, ..Default::default() })?;
    let table = client.table_names().first().cloned().ok_or("the server has no tables")?;
    let rows = client.row_bytes(&table)?;
    println!("connected to {address}: tables {:?}; '{table}' has {} fields ({rows:?} bytes per step)", client.table_names(), rows.len());

    // An actor: 50 steps, an item over the last 2 steps at each step.
    let mut writer = client.writer(Some(&table), Some(16))?;
    for t in 0..50u8 {
        let columns: Vec<Vec<u8>> = rows.iter().map(|&n| vec![t; n]).collect();
        let refs: Vec<&[u8]> = columns.iter().map(Vec::as_slice).collect();
        writer.append(&refs, Wait::default())?;
        if t >= 1 {
            writer.create_item(&table, 2, 1.0 + f64::from(t), &[], Wait::default())?;
        }
    }
    writer.end_episode(Wait::default())?;
    let keys = writer.flush(Wait::default())?;
    writer.close(Wait::default())?;
    println!("inserted {} items", keys.len());

    // A learner: sample, then update the sampled items' priorities.
    let drawn = client.sample(&table, 8, &[], Some(std::time::Duration::from_secs(5)), None)?;
    let r = &drawn.sample.response;
    println!("sampled keys {:?}, lengths {:?}, {} bytes of '{}'", r.keys, r.lengths, r.columns[0].len(), r.fields[0]);
    let updated = client.update_priorities(&table, &r.keys, &vec![0.5; r.keys.len()])?;
    println!("updated {updated} priorities; table size {}", client.info()?.iter().find(|i| i.name == table).map_or(0, |i| i.size));
    Ok(())
}
