//! etcdctl's command line grammar: cobra commands with pflag flags.
//!
//! etcdctl is built on cobra/pflag, and scripts depend on its exact
//! behaviour: subcommands found by unique prefix (`compact` is
//! `compaction`), flags anywhere on the line, booleans that take an
//! optional `=false`, `--` ending the flags, its error texts
//! (`unknown flag: --x`, `flag needs an argument: --rev`, `invalid
//! argument "x" for "--rev" flag: ...`) and its usage pages (rendered with
//! Go's tabwriter). A general-purpose parser (clap) spells all of these
//! differently, so the grammar is described here as data and parsed the
//! way pflag does.

use std::collections::{BTreeMap, HashSet};

use crate::gofmt;

/// A pflag value type (what `Value.Type()` returns decides the usage line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Str,
    Int,
    Uint,
    Duration,
    Strings,
    Float,
}

#[derive(Clone, Debug)]
pub struct Flag {
    pub name: &'static str,
    pub short: Option<char>,
    pub kind: Kind,
    pub default: &'static str,
    pub usage: &'static str,
    /// pflag's `MarkHidden`: accepted, but not listed in the usage page.
    pub hidden: bool,
}

pub fn flag(name: &'static str, kind: Kind, default: &'static str, usage: &'static str) -> Flag {
    Flag {
        name,
        short: None,
        kind,
        default,
        usage,
        hidden: false,
    }
}

/// A hidden flag (accepted, not in the usage page).
pub fn hidden(f: Flag) -> Flag {
    Flag { hidden: true, ..f }
}

pub fn short(
    name: &'static str,
    s: char,
    kind: Kind,
    default: &'static str,
    usage: &'static str,
) -> Flag {
    Flag {
        short: Some(s),
        ..flag(name, kind, default, usage)
    }
}

/// One cobra command.
#[derive(Clone, Debug, Default)]
pub struct Cmd {
    /// First word of `use_`.
    pub name: &'static str,
    pub use_: &'static str,
    pub short: &'static str,
    pub long: &'static str,
    /// Local flags.
    pub flags: Vec<Flag>,
    /// Persistent flags (inherited by subcommands).
    pub persistent: Vec<Flag>,
    pub subs: Vec<Cmd>,
    pub runnable: bool,
}

impl Cmd {
    pub fn new(use_: &'static str, short: &'static str) -> Cmd {
        Cmd {
            name: use_.split(' ').next().unwrap_or(use_),
            use_,
            short,
            runnable: true,
            ..Cmd::default()
        }
    }

    pub fn group(use_: &'static str, short: &'static str, subs: Vec<Cmd>) -> Cmd {
        Cmd {
            runnable: false,
            subs,
            ..Cmd::new(use_, short)
        }
    }

    pub fn long(mut self, l: &'static str) -> Cmd {
        self.long = l;
        self
    }

    pub fn flags(mut self, f: Vec<Flag>) -> Cmd {
        self.flags = f;
        self
    }

    pub fn persistent(mut self, f: Vec<Flag>) -> Cmd {
        self.persistent = f;
        self
    }
}

/// The parsed command line.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// Command names from the root's child down, e.g. `["lease", "grant"]`.
    pub path: Vec<&'static str>,
    pub args: Vec<String>,
    values: BTreeMap<&'static str, String>,
    /// Flags set on the command line.
    pub changed: HashSet<&'static str>,
    /// Every flag visible to the command (local first, then inherited).
    pub all_flags: Vec<Flag>,
    /// The inherited (global) flags of the command.
    pub inherited: Vec<Flag>,
    /// Arguments after `--` (cobra's ArgsLenAtDash).
    pub dash_at: Option<usize>,
}

impl Parsed {
    pub fn get(&self, name: &str) -> &str {
        self.values.get(name).map(|s| s.as_str()).unwrap_or("")
    }

    pub fn bool(&self, name: &str) -> bool {
        self.get(name) == "true"
    }

    pub fn i64(&self, name: &str) -> i64 {
        self.get(name).parse().unwrap_or(0)
    }

    pub fn u64(&self, name: &str) -> u64 {
        self.get(name).parse().unwrap_or(0)
    }

    pub fn f64(&self, name: &str) -> f64 {
        self.get(name).parse().unwrap_or(0.0)
    }

    pub fn dur(&self, name: &str) -> std::time::Duration {
        gofmt::parse_duration(self.get(name))
            .map(|d| std::time::Duration::from_nanos(d.max(0) as u64))
            .unwrap_or_default()
    }

    pub fn strings(&self, name: &str) -> Vec<String> {
        let v = self.get(name);
        let v = v.strip_prefix('[').unwrap_or(v);
        let v = v.strip_suffix(']').unwrap_or(v);
        if v.is_empty() {
            return Vec::new();
        }
        v.split(',').map(|s| s.to_string()).collect()
    }

    pub fn is_changed(&self, name: &str) -> bool {
        self.changed.contains(name)
    }

    /// Sets a flag as pflag's `Set` would (used for `ETCDCTL_*`).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let f = self
            .all_flags
            .iter()
            .find(|f| f.name == name)
            .cloned()
            .ok_or_else(|| format!("no such flag -{name}"))?;
        let v = normalize_value(&f, value)?;
        if f.kind == Kind::Strings && self.changed.contains(f.name) {
            let old = self.get(f.name).to_string();
            let old = old.trim_start_matches('[').trim_end_matches(']');
            let new = v.trim_start_matches('[').trim_end_matches(']');
            self.values.insert(f.name, format!("[{old},{new}]"));
        } else {
            self.values.insert(f.name, v);
        }
        self.changed.insert(f.name);
        Ok(())
    }
}

/// Validates and normalises a flag value the way pflag's `Set` does.
fn normalize_value(f: &Flag, v: &str) -> Result<String, String> {
    match f.kind {
        Kind::Bool => gofmt::parse_bool(v).map(|b| b.to_string()),
        Kind::Str => Ok(v.to_string()),
        Kind::Int => gofmt::parse_int(v, 0, 64).map(|n| n.to_string()),
        Kind::Uint => gofmt::parse_uint(v, 0, 64).map(|n| n.to_string()),
        Kind::Float => v.parse::<f64>().map(|n| n.to_string()).map_err(|_| {
            format!(
                "strconv.ParseFloat: parsing {}: invalid syntax",
                gofmt::quote(v)
            )
        }),
        Kind::Duration => gofmt::parse_duration(v).map(|_| v.to_string()),
        Kind::Strings => {
            // pflag reads the value as one CSV record.
            let parts = gofmt::read_csv_record(v)?;
            Ok(format!("[{}]", parts.join(",")))
        }
    }
}

/// A parse failure: what cobra prints and how etcdctl exits.
#[derive(Debug)]
pub enum ParseError {
    /// An unknown command under the root (`unknown command "x" for "etcdctl"`).
    UnknownCommand { msg: String },
    /// A flag error on `path` (usage printed to stdout).
    Flag {
        path: Vec<&'static str>,
        msg: String,
    },
    /// `-h`/`--help`, or a command group run without a subcommand.
    Help { path: Vec<&'static str> },
    /// `etcdctl help <words>` naming no command.
    UnknownHelpTopic { words: Vec<String> },
}

fn find_child<'a>(c: &'a Cmd, name: &str) -> Option<&'a Cmd> {
    if let Some(s) = c.subs.iter().find(|s| s.name == name) {
        return Some(s);
    }
    let m: Vec<&Cmd> = c.subs.iter().filter(|s| s.name.starts_with(name)).collect();
    if m.len() == 1 {
        Some(m[0])
    } else {
        None
    }
}

/// The command at `path`.
pub fn lookup<'a>(root: &'a Cmd, path: &[&str]) -> &'a Cmd {
    let mut c = root;
    for p in path {
        c = c.subs.iter().find(|s| s.name == *p).expect("valid path");
    }
    c
}

/// Flags visible at `path`: (local incl. persistent of the command itself, inherited).
fn flagsets(root: &Cmd, path: &[&str]) -> (Vec<Flag>, Vec<Flag>) {
    let mut inherited: Vec<Flag> = Vec::new();
    let mut c = root;
    for p in path {
        inherited.extend(c.persistent.iter().cloned());
        c = c.subs.iter().find(|s| s.name == *p).expect("valid path");
    }
    let mut local: Vec<Flag> = c.flags.clone();
    local.extend(c.persistent.iter().cloned());
    let name = if path.is_empty() { "etcdctl" } else { c.name };
    local.push(Flag {
        name: "help",
        short: Some('h'),
        kind: Kind::Bool,
        default: "false",
        usage: leak(format!("help for {name}")),
        hidden: false,
    });
    (local, inherited)
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn takes_no_value(flags: &[Flag], name: &str) -> bool {
    flags.iter().any(|f| f.name == name && f.kind == Kind::Bool)
}

fn short_takes_no_value(flags: &[Flag], s: &str) -> bool {
    let Some(c) = s.chars().next() else {
        return false;
    };
    flags
        .iter()
        .any(|f| f.short == Some(c) && f.kind == Kind::Bool)
}

/// cobra's stripFlags: the non-flag words of `args`.
fn strip_flags(args: &[String], flags: &[Flag]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let s = &args[i];
        i += 1;
        if s == "--" {
            break;
        } else if let Some(n) = s.strip_prefix("--") {
            if !s.contains('=') && !takes_no_value(flags, n) {
                i += 1;
            }
        } else if s.starts_with('-') && !s.contains('=') && s.len() == 2 {
            if !short_takes_no_value(flags, &s[1..]) {
                i += 1;
            }
        } else if !s.is_empty() && !s.starts_with('-') {
            out.push(s.clone());
        }
    }
    out
}

/// cobra's argsMinusFirstX: `args` without the first occurrence of `x` as a word.
fn args_minus_first(args: &[String], flags: &[Flag], x: &str) -> Vec<String> {
    let mut i = 0;
    while i < args.len() {
        let s = &args[i];
        if s == "--" {
            break;
        }
        if let Some(n) = s.strip_prefix("--") {
            if !s.contains('=') && !takes_no_value(flags, n) {
                i += 2;
                continue;
            }
        } else if s.starts_with('-')
            && !s.contains('=')
            && s.len() == 2
            && !short_takes_no_value(flags, &s[1..])
        {
            i += 2;
            continue;
        }
        if s == x {
            let mut out = args[..i].to_vec();
            out.extend_from_slice(&args[i + 1..]);
            return out;
        }
        i += 1;
    }
    args.to_vec()
}

/// Parses `args` (without the program name) against `root`.
pub fn parse(root: &Cmd, args: &[String]) -> Result<Parsed, ParseError> {
    // Find the command (cobra's Find).
    let mut path: Vec<&'static str> = Vec::new();
    let mut cur = root;
    let mut rest = args.to_vec();
    loop {
        let (l, i) = flagsets(root, &path);
        let all: Vec<Flag> = l.into_iter().chain(i).collect();
        let words = strip_flags(&rest, &all);
        let Some(next) = words.first() else { break };
        if path.is_empty() && next == "help" {
            // cobra's help command: `help [command...]`.
            let mut hp = Vec::new();
            let mut c = root;
            for w in &words[1..] {
                match find_child(c, w) {
                    Some(s) => {
                        hp.push(s.name);
                        c = s;
                    }
                    None => {
                        return Err(ParseError::UnknownHelpTopic {
                            words: words[1..].to_vec(),
                        })
                    }
                }
            }
            return Err(ParseError::Help { path: hp });
        }
        match find_child(cur, next) {
            Some(c) => {
                rest = args_minus_first(&rest, &all, next);
                path.push(c.name);
                cur = c;
            }
            None => break,
        }
    }
    // legacyArgs: the root takes no arguments.
    if path.is_empty() {
        let (l, i) = flagsets(root, &path);
        let all: Vec<Flag> = l.into_iter().chain(i).collect();
        let words = strip_flags(&rest, &all);
        if let Some(w) = words.first() {
            let mut msg = format!("unknown command {} for \"etcdctl\"", gofmt::quote(w));
            let sugg = suggestions(root, w);
            if !sugg.is_empty() {
                msg.push_str("\n\nDid you mean this?\n");
                for s in sugg {
                    msg.push_str(&format!("\t{s}\n"));
                }
            }
            return Err(ParseError::UnknownCommand { msg });
        }
    }
    let (local, inherited) = flagsets(root, &path);
    let all: Vec<Flag> = local
        .iter()
        .cloned()
        .chain(inherited.iter().cloned())
        .collect();
    let mut p = Parsed {
        path: path.clone(),
        args: Vec::new(),
        values: all
            .iter()
            .map(|f| (f.name, f.default.to_string()))
            .collect(),
        changed: HashSet::new(),
        all_flags: all.clone(),
        inherited: inherited.clone(),
        dash_at: None,
    };
    let ferr = |msg: String| ParseError::Flag {
        path: path.clone(),
        msg,
    };
    let mut i = 0;
    while i < rest.len() {
        let s = rest[i].clone();
        i += 1;
        if s == "--" {
            p.dash_at = Some(p.args.len());
            p.args.extend(rest[i..].iter().cloned());
            break;
        }
        if let Some(body) = s.strip_prefix("--") {
            let (name, val) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let Some(f) = all.iter().find(|f| f.name == name) else {
                return Err(ferr(format!("unknown flag: --{name}")));
            };
            let val = match val {
                Some(v) => v,
                None if f.kind == Kind::Bool => "true".to_string(),
                None if i < rest.len() => {
                    i += 1;
                    rest[i - 1].clone()
                }
                None => return Err(ferr(format!("flag needs an argument: {s}"))),
            };
            set_flag(&mut p, f, &val).map_err(ferr)?;
        } else if s.len() > 1 && s.starts_with('-') {
            let mut shorts: &str = &s[1..];
            while !shorts.is_empty() {
                let c = shorts.chars().next().expect("non-empty");
                let Some(f) = all.iter().find(|f| f.short == Some(c)) else {
                    return Err(ferr(format!(
                        "unknown shorthand flag: {} in -{shorts}",
                        gofmt::quote_rune(c)
                    )));
                };
                let after = &shorts[c.len_utf8()..];
                let val;
                if let Some(v) = after.strip_prefix('=') {
                    val = v.to_string();
                    shorts = "";
                } else if f.kind == Kind::Bool {
                    val = "true".to_string();
                    shorts = after;
                } else if !after.is_empty() {
                    val = after.to_string();
                    shorts = "";
                } else if i < rest.len() {
                    val = rest[i].clone();
                    i += 1;
                    shorts = "";
                } else {
                    return Err(ferr(format!(
                        "flag needs an argument: {} in -{shorts}",
                        gofmt::quote_rune(c)
                    )));
                }
                set_flag(&mut p, f, &val).map_err(ferr)?;
            }
        } else {
            p.args.push(s);
        }
    }
    if p.bool("help") {
        return Err(ParseError::Help { path });
    }
    let cmd = lookup(root, &path);
    if !cmd.runnable {
        return Err(ParseError::Help { path });
    }
    Ok(p)
}

fn set_flag(p: &mut Parsed, f: &Flag, val: &str) -> Result<(), String> {
    p.set(f.name, val).map_err(|e| {
        let name = match f.short {
            Some(s) => format!("-{s}, --{}", f.name),
            None => format!("--{}", f.name),
        };
        format!(
            "invalid argument {} for {} flag: {e}",
            gofmt::quote(val),
            gofmt::quote(&name)
        )
    })
}

/// cobra's SuggestionsFor (Levenshtein distance <= 2, or a prefix).
fn suggestions(root: &Cmd, typed: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    for c in &root.subs {
        let d = levenshtein(&typed.to_lowercase(), &c.name.to_lowercase());
        if d <= 2 || c.name.to_lowercase().starts_with(&typed.to_lowercase()) {
            out.push(c.name);
        }
    }
    out
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn flag_usages(flags: &[Flag]) -> String {
    let mut fs: Vec<&Flag> = flags.iter().filter(|f| !f.hidden).collect();
    fs.sort_by_key(|f| f.name);
    fs.dedup_by_key(|f| f.name);
    let mut out = String::new();
    for f in fs {
        match f.short {
            Some(s) => out.push_str(&format!("  -{s}, --{}", f.name)),
            None => out.push_str(&format!("      --{}", f.name)),
        }
        let def = if f.kind == Kind::Str {
            gofmt::quote(f.default)
        } else {
            f.default.to_string()
        };
        if f.kind == Kind::Bool {
            out.push_str(&format!("[={def}]"));
        } else {
            out.push_str(&format!("={def}"));
        }
        out.push_str(&format!("\t{}\n", f.usage));
    }
    out
}

/// pflag's `FlagUsages`: one line per flag, sorted by name, the usage
/// text aligned one column past the longest `--name type`, a non-zero
/// default after it.
fn pflag_usages(flags: &[Flag]) -> String {
    let mut fs: Vec<&Flag> = flags.iter().filter(|f| !f.hidden).collect();
    fs.sort_by_key(|f| f.name);
    fs.dedup_by_key(|f| f.name);
    let lines: Vec<(String, String)> = fs
        .iter()
        .map(|f| {
            let mut line = match f.short {
                Some(s) => format!("  -{s}, --{}", f.name),
                None => format!("      --{}", f.name),
            };
            let type_name = match f.kind {
                Kind::Bool => "",
                Kind::Str => "string",
                Kind::Int => "int",
                Kind::Uint => "uint",
                Kind::Duration => "duration",
                Kind::Strings => "strings",
                Kind::Float => "float",
            };
            if !type_name.is_empty() {
                line += &format!(" {type_name}");
            }
            let zero = match f.kind {
                Kind::Bool => f.default == "false",
                Kind::Str => f.default.is_empty(),
                Kind::Duration => f.default == "0" || f.default == "0s",
                Kind::Strings => f.default.is_empty() || f.default == "[]",
                _ => f.default == "0",
            };
            let mut usage = f.usage.to_string();
            if !zero {
                usage += &match f.kind {
                    Kind::Str => format!(" (default {})", gofmt::quote(f.default)),
                    _ => format!(" (default {})", f.default),
                };
            }
            (line, usage)
        })
        .collect();
    let width = lines.iter().map(|(l, _)| l.len() + 1).max().unwrap_or(0);
    lines
        .iter()
        .map(|(l, u)| format!("{l} {} {u}\n", " ".repeat(width - l.len())))
        .collect()
}

/// cobra's default usage text (what a command outside etcdctl's root
/// prints on a flag error, as `txn` runs its put/get/del lines under a
/// bare root): the use line, then the command's own flags and `--help`.
pub fn default_usage(root: &Cmd, path: &[&str]) -> String {
    let c = lookup(root, path);
    let mut flags = c.flags.clone();
    flags.push(short(
        "help",
        'h',
        Kind::Bool,
        "false",
        leak(format!("help for {}", c.name)),
    ));
    let mut useline = format!(" {}", c.use_);
    if !useline.contains("[flags]") {
        useline.push_str(" [flags]");
    }
    format!("Usage:\n  {useline}\n\nFlags:\n{}\n", pflag_usages(&flags))
}

/// Every command below `c`, depth first, cobra-sorted by name.
fn descendants<'a>(c: &'a Cmd, prefix: &str, out: &mut Vec<(String, &'a Cmd)>) {
    let mut subs: Vec<&Cmd> = c.subs.iter().collect();
    subs.sort_by_key(|s| s.name);
    for s in subs {
        let name = if prefix.is_empty() {
            s.name.to_string()
        } else {
            format!("{prefix} {}", s.name)
        };
        out.push((name.clone(), s));
        descendants(s, &name, out);
    }
}

/// etcd's cobrautl usage page of the command at `path`.
pub fn usage(root: &Cmd, path: &[&str], version: &str, api: &str) -> String {
    let c = lookup(root, path);
    let (local, inherited) = flagsets(root, path);
    let mut t = String::new();
    t.push_str("NAME:\n");
    if path.is_empty() {
        t.push_str(&format!("\t{} - {}\n", "etcdctl", c.short));
    } else {
        t.push_str(&format!("\t{} - {}\n", path.join(" "), c.short));
    }
    t.push_str("\nUSAGE:\n");
    let mut useline = if path.is_empty() {
        c.use_.to_string()
    } else {
        format!("etcdctl {} {}", path[..path.len() - 1].join(" "), c.use_).replace("  ", " ")
    };
    if !useline.contains("[flags]") {
        useline.push_str(" [flags]");
    }
    t.push_str(&format!("\t{useline}\n"));
    if path.is_empty() {
        t.push_str(&format!("\nVERSION:\n\t{version}\n"));
    }
    if !c.subs.is_empty() {
        t.push_str(&format!("\nAPI VERSION:\n\t{api}\n"));
        t.push_str("\n\nCOMMANDS:\n");
        let mut all = Vec::new();
        descendants(c, "", &mut all);
        if path.is_empty() {
            all.push(("help".to_string(), &HELP));
            all.sort_by(|a, b| a.0.cmp(&b.0));
        }
        for (name, s) in all {
            if s.runnable {
                t.push_str(&format!("\t{name}\t{}\n", s.short));
            }
        }
    }
    if !c.long.is_empty() {
        t.push_str("\nDESCRIPTION:\n");
        for line in c
            .long
            .trim_matches(|ch| ch == '\n' || ch == '\t' || ch == ' ')
            .split('\n')
        {
            t.push_str(&format!("\t{line}\n"));
        }
    }
    t.push_str("\nOPTIONS:\n");
    t.push_str(&flag_usages(&local));
    if !inherited.is_empty() {
        t.push_str("\nGLOBAL OPTIONS:\n");
        t.push_str(&flag_usages(&inherited));
    }
    t.push('\n');
    gofmt::tabwrite(&t)
}

static HELP: Cmd = Cmd {
    name: "help",
    use_: "help [command]",
    short: "Help about any command",
    long: "",
    flags: Vec::new(),
    persistent: Vec::new(),
    subs: Vec::new(),
    runnable: true,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Cmd {
        let mut r = Cmd::group(
            "etcdctl",
            "A simple command line client for etcd3.",
            vec![
                Cmd::new(
                    "get [options] <key> [range_end]",
                    "Gets the key or a range of keys",
                )
                .flags(vec![
                    flag("prefix", Kind::Bool, "false", "p"),
                    flag("rev", Kind::Int, "0", "r"),
                ]),
                Cmd::new("compaction [options] <revision>", "Compacts"),
                Cmd::group(
                    "lease <subcommand>",
                    "Lease",
                    vec![Cmd::new("grant <ttl>", "Creates leases")],
                ),
            ],
        );
        r.persistent = vec![short("write-out", 'w', Kind::Str, "simple", "fmt")];
        r
    }

    fn a(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn prefix_and_interspersed() {
        let p = parse(&root(), &a(&["-w", "json", "compact", "4"])).unwrap();
        assert_eq!(p.path, vec!["compaction"]);
        assert_eq!(p.args, vec!["4"]);
        assert_eq!(p.get("write-out"), "json");
        let p = parse(&root(), &a(&["get", "k", "--prefix", "--rev=3", "-wjson"])).unwrap();
        assert!(p.bool("prefix"));
        assert_eq!(p.i64("rev"), 3);
        assert_eq!(p.get("write-out"), "json");
        let p = parse(&root(), &a(&["lease", "grant", "10"])).unwrap();
        assert_eq!(p.path, vec!["lease", "grant"]);
    }

    #[test]
    fn errors() {
        match parse(&root(), &a(&["get", "k", "--bogus"])) {
            Err(ParseError::Flag { msg, .. }) => assert_eq!(msg, "unknown flag: --bogus"),
            e => panic!("{e:?}"),
        }
        match parse(&root(), &a(&["get", "k", "--rev", "x"])) {
            Err(ParseError::Flag { msg, .. }) => assert_eq!(
                msg,
                "invalid argument \"x\" for \"--rev\" flag: strconv.ParseInt: parsing \"x\": invalid syntax"
            ),
            e => panic!("{e:?}"),
        }
        match parse(&root(), &a(&["get", "k", "-w"])) {
            Err(ParseError::Flag { msg, .. }) => {
                assert_eq!(msg, "flag needs an argument: 'w' in -w")
            }
            e => panic!("{e:?}"),
        }
        match parse(&root(), &a(&["bogus"])) {
            Err(ParseError::UnknownCommand { msg }) => {
                assert_eq!(msg, "unknown command \"bogus\" for \"etcdctl\"")
            }
            e => panic!("{e:?}"),
        }
        assert!(matches!(
            parse(&root(), &a(&["lease"])),
            Err(ParseError::Help { .. })
        ));
    }
}
