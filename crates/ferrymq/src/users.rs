//! `ferrymq user ...`: users, grants and API tokens of a running broker over the binary protocol,
//! and `reset-admin`, which works offline on a stopped broker's data dir.
//!
//! New passwords are never taken from a flag's value (it would show in `ps` and shell history):
//! they come from `--password-file`, `FERRYMQ_NEW_PASSWORD`, or the first line of stdin.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ferrymq_broker::auth::{actions_to_string, parse_actions, parse_roles, roles_to_string};
use serde_json::json;

use crate::cmd::ConnectArgs;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  FERRYMQ_USER=admin FERRYMQ_PASSWORD=... ferrymq user add billing < billing.pass\n  ferrymq user grant billing 'orders.*' publish,consume\n  ferrymq user grant grafana --role monitor\n  ferrymq user token create deploy --owner billing --expires 30d\n  ferrymq user reset-admin --data-dir /var/lib/ferrymq < admin.pass"
)]
pub struct UserArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: UserCommand,
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Add a user (admin only); its password from --password-file, FERRYMQ_NEW_PASSWORD or stdin.
    Add {
        name: String,
        /// admin or monitor; repeat or separate with commas.
        #[arg(long = "role", value_name = "ROLE")]
        roles: Vec<String>,
        #[command(flatten)]
        password: NewPassword,
    },
    /// Remove a user (admin only): its connections lose their rights at once.
    Remove { name: String },
    /// Set a password: your own without NAME, anyone's as an admin.
    Passwd {
        name: Option<String>,
        #[command(flatten)]
        password: NewPassword,
    },
    /// List users with their roles, grants and token counts (admin only).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Grant actions on a topic pattern (an exact name, a prefix such as 'orders.*', or '*'),
    /// and/or a role (admin only).
    Grant {
        name: String,
        pattern: Option<String>,
        /// publish, consume, inspect, manage, purge, pause, separated by commas, or all
        /// (manage implies purge and pause).
        actions: Option<String>,
        #[arg(long = "role", value_name = "ROLE")]
        roles: Vec<String>,
    },
    /// Take actions on exactly a pattern, and/or a role, away (admin only).
    Revoke {
        name: String,
        pattern: Option<String>,
        actions: Option<String>,
        #[arg(long = "role", value_name = "ROLE")]
        roles: Vec<String>,
    },
    /// API tokens: create, list, revoke.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Set the admin's password in a stopped broker's data dir (offline), creating the user if
    /// needed: the way back in after a lost admin password.
    ResetAdmin {
        /// The broker's data directory.
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// The admin user's name.
        #[arg(long, default_value = "admin")]
        name: String,
        #[command(flatten)]
        password: NewPassword,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a named token; it is printed once and the broker keeps only its hash.
    Create {
        name: String,
        /// The user the token belongs to [default: yourself]; another user's needs admin.
        #[arg(long)]
        owner: Option<String>,
        /// Lifetime such as 90m, 12h or 30d [default: never expires].
        #[arg(long, value_parser = parse_lifetime)]
        expires: Option<Duration>,
        #[arg(long)]
        json: bool,
    },
    /// List token names and dates (never their values).
    List {
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token: connections using it lose their rights at once.
    Revoke {
        name: String,
        #[arg(long)]
        owner: Option<String>,
    },
}

#[derive(Args, Debug)]
pub struct NewPassword {
    /// Read the new password from the first line of this file.
    #[arg(long, value_name = "PATH")]
    password_file: Option<PathBuf>,
}

impl NewPassword {
    /// From the file, FERRYMQ_NEW_PASSWORD (or `fallback_env`), or the first line of stdin.
    fn read(&self, fallback_env: Option<&str>) -> anyhow::Result<String> {
        let password = if let Some(path) = &self.password_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the password file {}", path.display()))?;
            text.lines().next().unwrap_or("").to_owned()
        } else if let Some(value) = std::iter::once("FERRYMQ_NEW_PASSWORD")
            .chain(fallback_env)
            .find_map(|name| std::env::var(name).ok())
        {
            value
        } else {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("cannot read the new password from stdin")?;
            line.trim_end_matches(['\r', '\n']).to_owned()
        };
        if password.is_empty() {
            let env = fallback_env.unwrap_or("FERRYMQ_NEW_PASSWORD");
            bail!("no new password: give --password-file, set {env}, or write it to stdin");
        }
        Ok(password)
    }
}

/// `90m`, `12h`, `30d`, `45s`.
fn parse_lifetime(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a lifetime like 90m, 12h or 30d");
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    if n == 0 {
        return Err(bad());
    }
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

fn roles_of(list: &[String]) -> anyhow::Result<u8> {
    let mut bits = 0;
    for role in list {
        bits |= parse_roles(role)?;
    }
    Ok(bits)
}

fn grant_arguments(
    pattern: &Option<String>,
    actions: &Option<String>,
    roles: &[String],
) -> anyhow::Result<(String, u8, u8)> {
    let roles = roles_of(roles)?;
    let actions = match (pattern, actions) {
        (Some(_), Some(actions)) => parse_actions(actions)?,
        (Some(pattern), None) => {
            bail!(
                "name the actions to go with '{pattern}': publish, consume, inspect, manage, \
                 purge, pause or all"
            )
        }
        (None, _) if roles == 0 => bail!("name a topic pattern and actions, or --role"),
        (None, _) => 0,
    };
    Ok((pattern.clone().unwrap_or_default(), actions, roles))
}

fn format_ms(ms: u64) -> String {
    if ms == 0 {
        "never".to_owned()
    } else {
        crate::cmd::time_text(ms)
    }
}

pub fn run(args: UserArgs) -> anyhow::Result<()> {
    if let UserCommand::ResetAdmin {
        data_dir,
        name,
        password,
    } = &args.command
    {
        let password = password.read(Some("FERRYMQ_ADMIN_PASSWORD"))?;
        // The metadata it may create holds password hashes: the owner's alone, as serve makes it.
        crate::serve::keep_files_private();
        let created = ferrymq_broker::auth::reset_admin(data_dir, name, &password)
            .with_context(|| format!("cannot reset the admin in {}", data_dir.display()))?;
        match created {
            true => println!("admin user '{name}' created in {}", data_dir.display()),
            false => println!("password of '{name}' reset; it has the admin role"),
        }
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let client = args.connect.connect("user").await?;
        let result = command(&client, args.command).await;
        let _ = client.close().await;
        result
    })
}

async fn command(client: &ferrymq_client::Client, command: UserCommand) -> anyhow::Result<()> {
    match command {
        UserCommand::Add {
            name,
            roles,
            password,
        } => {
            let roles = roles_of(&roles)?;
            let password = password.read(None)?;
            client.user_add(&name, &password, roles).await?;
            println!("user '{name}' added");
        }
        UserCommand::Remove { name } => {
            client.user_remove(&name).await?;
            println!("user '{name}' removed");
        }
        UserCommand::Passwd { name, password } => {
            let password = password.read(None)?;
            let name = name.unwrap_or_default();
            client.user_passwd(&name, &password).await?;
            println!("password changed");
        }
        UserCommand::List { json } => list_users(client, json).await?,
        UserCommand::Grant {
            name,
            pattern,
            actions,
            roles,
        } => {
            let (pattern, actions, roles) = grant_arguments(&pattern, &actions, &roles)?;
            client.grant(&name, &pattern, actions, roles).await?;
            println!("granted");
        }
        UserCommand::Revoke {
            name,
            pattern,
            actions,
            roles,
        } => {
            let (pattern, actions, roles) = grant_arguments(&pattern, &actions, &roles)?;
            client.revoke(&name, &pattern, actions, roles).await?;
            println!("revoked");
        }
        UserCommand::Token { command } => token(client, command).await?,
        UserCommand::ResetAdmin { .. } => unreachable!("handled offline before connecting"),
    }
    Ok(())
}

async fn list_users(client: &ferrymq_client::Client, json: bool) -> anyhow::Result<()> {
    let users = client.user_list().await?;
    if json {
        let list: Vec<_> = users
            .iter()
            .map(|u| {
                json!({
                    "name": u.name,
                    "roles": roles_to_string(u.roles).split(',').filter(|r| !r.is_empty()).collect::<Vec<_>>(),
                    "tokens": u.tokens,
                    "grants": u.grants.iter().map(|(p, a)| json!({"pattern": p, "actions": actions_to_string(*a).split(',').collect::<Vec<_>>()})).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        println!("{:<24} {:<14} {:>6}  GRANTS", "USER", "ROLES", "TOKENS");
        for u in users {
            let grants: Vec<String> = u
                .grants
                .iter()
                .map(|(p, a)| format!("{p}:{}", actions_to_string(*a)))
                .collect();
            println!(
                "{:<24} {:<14} {:>6}  {}",
                u.name,
                roles_to_string(u.roles),
                u.tokens,
                grants.join(" ")
            );
        }
    }
    Ok(())
}

async fn token(client: &ferrymq_client::Client, command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create {
            name,
            owner,
            expires,
            json,
        } => {
            let expires_ms = match expires {
                None => 0,
                Some(lifetime) => {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    (now + lifetime).as_millis() as u64
                }
            };
            let created = client
                .token_create(owner.as_deref().unwrap_or(""), &name, expires_ms)
                .await?;
            if json {
                println!(
                    "{}",
                    json!({"name": created.name, "token": created.token, "expires_ms": created.expires_ms})
                );
            } else {
                println!("{}", created.token);
                eprintln!(
                    "token '{}' created (expires: {}); it is shown only now: keep it in a secret store",
                    created.name,
                    format_ms(created.expires_ms)
                );
            }
        }
        TokenCommand::List { owner, json } => {
            let tokens = client.token_list(owner.as_deref().unwrap_or("")).await?;
            if json {
                let list: Vec<_> = tokens
                    .iter()
                    .map(|t| json!({"name": t.name, "created_ms": t.created_ms, "expires_ms": t.expires_ms}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<24} {:<24} EXPIRES", "TOKEN", "CREATED");
                for t in tokens {
                    println!(
                        "{:<24} {:<24} {}",
                        t.name,
                        format_ms(t.created_ms),
                        format_ms(t.expires_ms)
                    );
                }
            }
        }
        TokenCommand::Revoke { name, owner } => {
            client
                .token_revoke(owner.as_deref().unwrap_or(""), &name)
                .await?;
            println!("token '{name}' revoked");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_lifetime("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(parse_lifetime("90m").unwrap(), Duration::from_secs(5400));
        for bad in ["", "d", "0d", "5", "5y", "-1d"] {
            assert!(
                parse_lifetime(bad).unwrap_err().contains("lifetime"),
                "{bad}"
            );
        }
    }

    #[test]
    fn grant_arguments_need_actions_with_a_pattern() {
        assert!(grant_arguments(&Some("orders.*".into()), &None, &[]).is_err());
        assert!(grant_arguments(&None, &None, &[]).is_err());
        assert_eq!(
            grant_arguments(&None, &None, &["monitor".into()]).unwrap(),
            (String::new(), 0, 2)
        );
        assert_eq!(
            grant_arguments(&Some("*".into()), &Some("publish,consume".into()), &[]).unwrap(),
            ("*".into(), 3, 0)
        );
    }
}
