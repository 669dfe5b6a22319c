// The Dockerfile subset that template builds accept: one stage, the instructions FROM RUN COPY
// ADD ENV WORKDIR USER ARG LABEL CMD ENTRYPOINT, Docker's lexical rules (parser directives,
// line continuations, comments, quotes, exec and shell forms), and Docker's variable
// substitution for the build to apply. The text comes from clients: Parse takes at most 1 MiB,
// never throws, bounds what it builds and names the line of every error. No I/O here
// (tests/fuzz/dockerfile_fuzz.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::image::dockerfile {

enum class Kind { kFrom, kRun, kCopy, kAdd, kEnv, kWorkdir, kUser, kArg, kLabel, kCmd, kEntrypoint };

// Words that Docker would substitute variables in (value, sources, dest, chown, the values of
// pairs) are given in Expand's syntax, quotes already removed: a `$` that quotes or an escape
// made literal is written `\$`, so that Expand leaves it a `$`. Words of an exec form (JSON)
// are as the JSON gives them.
struct Step {
  Kind kind;
  int line = 0;          // 1-based line where the instruction starts
  std::string text;      // the instruction as written, continuation lines joined with a space, comments dropped; used in logs and in the build cache key
  // kFrom, kWorkdir, kUser: the (unexpanded) argument.
  std::string value;
  // kRun, kCmd, kEntrypoint: exec form (JSON array of strings) -> args as given, shell_form=false;
  // shell form -> args = {"/bin/sh", "-c", REST} with REST the rest of the line, shell_form=true.
  std::vector<std::string> args;
  bool shell_form = false;
  // kEnv, kLabel: the pairs in order (both `ENV K=V K2="v 2"` and the legacy `ENV K V with spaces`);
  // quotes removed, backslash escapes applied. kArg: one pair {name, default}; has_default says whether `=` was given.
  std::vector<std::pair<std::string, std::string>> pairs;
  bool has_default = false;
  // kCopy, kAdd: sources (one or more, unexpanded) and the destination; exec (JSON array) form too.
  std::vector<std::string> sources;
  std::string dest;
  std::string chown;                // --chown=USER[:GROUP], "" if absent
  std::optional<uint32_t> chmod;    // --chmod=OCTAL (e.g. 755), absent if not given; bad octal = error
};

struct Dockerfile {
  std::vector<Step> args_before_from;  // ARG steps before FROM (they may be used in FROM)
  std::vector<Step> steps;             // FROM first, then the rest in order
};

// InvalidArgument with a message "Dockerfile line N: ..." naming the line for: an unknown or unsupported instruction
// (say which and list the supported ones: FROM RUN COPY ADD ENV WORKDIR USER ARG LABEL CMD ENTRYPOINT),
// a second FROM or `FROM x AS name` (multi-stage builds are not supported: say so),
// COPY --from (same), any other unknown --flag, an instruction before FROM other than ARG, a missing argument,
// a bad JSON array in exec form, unterminated quotes, a line continuation at the end of the file is fine.
// "Dockerfile: no FROM" / "Dockerfile: empty" for whole-file problems. Input over 1 MiB: "Dockerfile: larger than 1 MiB".
// Supported also: instruction keywords case-insensitive; `#` comment lines (also inside continuations, as Docker does);
// blank lines; a `# syntax=` / `# escape=` parser directive at the very top (escape=` switches the escape character to backtick; support both \ and `);
// Windows CRLF line endings; leading whitespace.
//
// Where this differs from Docker: continuation lines are joined with one space (Docker joins
// them with nothing, which only matters for a word cut in two); an exec form (RUN, CMD,
// ENTRYPOINT, COPY, ADD) is a JSON array with nothing after it (Docker ignores text after the
// `]`), and a JSON array holding a non-string is an error, as in Docker; an invalid JSON text
// is shell form. At most 10,000 instructions; an ARG names one variable.
absl::StatusOr<Dockerfile> Parse(std::string_view text);

// Docker's variable substitution in a word: $NAME, ${NAME}, ${NAME:-default}, ${NAME:+alt}, and `\$` for a literal `$`.
// Unknown variables expand to "". Bad syntax (`${` without `}`, `${}`) is InvalidArgument "bad variable substitution in \"...\"".
// Also ${NAME-default} and ${NAME+alt} (for a set NAME, even empty), and substitutions nested
// in a default (16 deep at most). Any other backslash is literal. A result over 1 MiB is
// InvalidArgument too: ENV A=$A$A repeated would otherwise double per line.
absl::StatusOr<std::string> Expand(std::string_view word, const std::map<std::string, std::string>& vars);

}  // namespace sbx::image::dockerfile
