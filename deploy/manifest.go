// Package deploy holds Concord's example deployment (Kubernetes manifests under kubernetes/) and the
// check that keeps it honest: every CONCORD_* variable a manifest sets must be one the command its
// container runs reads, so the manifests cannot drift from the flags. The commands' own tests call
// [CheckEnv] with their cli.App.
//
// The manifests are read by a small line-based reader of the YAML they use, not a YAML library. It
// is strict where it cannot follow: a CONCORD_ name anywhere other than an env entry's name (a
// ConfigMap key, an envFrom source, a flow-style env list) is an error, as is a container that sets
// CONCORD_ variables without naming its command, so nothing escapes the check unseen.
package deploy

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// Manifests are the example manifests, kubernetes/*.yaml.
//
//go:embed kubernetes/*.yaml
var Manifests embed.FS

// Container is one container of a manifest.
type Container struct {
	File string // manifest file, relative to the FS it was read from
	Line int    // line of the container's list item, from 1
	// Command is the container's command followed by its args (both optional), as written.
	Command []string
	Env     []EnvVar // its env entries, in order
}

// EnvVar is one entry of a container's env list.
type EnvVar struct {
	Name  string
	Line  int    // line of its name
	Value string // its value when given as one (not valueFrom), unquoted
}

// Program is the base name of the container's first command word ("peer" for /usr/local/bin/peer),
// or "" when the container names no command.
func (c Container) Program() string {
	if len(c.Command) == 0 {
		return ""
	}
	return path.Base(c.Command[0])
}

// concordName matches the names of the commands' environment variables.
var concordName = regexp.MustCompile(`CONCORD_[A-Za-z0-9_]*`)

// ReadContainers returns the containers (and init containers) of every *.yaml and *.yml file under
// fsys, in file order. A CONCORD_ name that is not the name of a container's env entry, and an envFrom
// in a container that sets CONCORD_ variables, are errors: the check could not see what they set.
func ReadContainers(fsys fs.FS) ([]Container, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ext := path.Ext(p); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var all []Container
	var errs []error
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		cs, err := ParseContainers(f, string(b))
		all = append(all, cs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return all, errors.Join(errs...)
}

// line is one line of a manifest without its comment, with its indentation.
type line struct {
	n      int    // line number, from 1
	indent int    // leading spaces
	text   string // the rest, trimmed, comment removed; never empty
}

// ParseContainers reads the containers of one manifest file named name (for messages). It returns the
// containers it found even when it also returns an error.
func ParseContainers(name, src string) ([]Container, error) {
	var lines []line
	for i, raw := range strings.Split(src, "\n") {
		raw = strings.TrimRight(raw, "\r")
		if strings.HasPrefix(strings.TrimLeft(raw, " "), "\t") {
			return nil, fmt.Errorf("%s:%d: indented with a tab", name, i+1)
		}
		text := stripComment(raw)
		trimmed := strings.TrimLeft(text, " ")
		if strings.TrimSpace(trimmed) == "" {
			continue
		}
		lines = append(lines, line{n: i + 1, indent: len(text) - len(trimmed), text: strings.TrimRight(trimmed, " ")})
	}

	var cs []Container
	var errs []error
	seen := map[int]bool{} // lines whose CONCORD_ name is accounted for: env entry names
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		key, rest := splitKey(itemBody(l.text))
		if (key != "containers" && key != "initContainers") || rest != "" {
			continue
		}
		keyIndent := itemKeyIndent(lines, i)
		end := blockEnd(lines, i, keyIndent)
		for _, item := range items(lines, i+1, end) {
			c, err := parseContainer(name, lines, item[0], item[1], seen)
			cs = append(cs, c)
			if err != nil {
				errs = append(errs, err)
			}
		}
		i = end - 1
	}
	for _, l := range lines {
		if concordName.MatchString(l.text) && !seen[l.n] {
			errs = append(errs, fmt.Errorf("%s:%d: %s outside a container's env entry name: the environment check cannot follow it (use env: - name: ...)",
				name, l.n, concordName.FindString(l.text)))
		}
	}
	return cs, errors.Join(errs...)
}

// parseContainer reads the container whose list item spans lines[start:end].
func parseContainer(file string, lines []line, start, end int, seen map[int]bool) (Container, error) {
	c := Container{File: file, Line: lines[start].n}
	var errs []error
	keyIndent := itemKeyIndent(lines, start)
	for j := start; j < end; j++ {
		l := lines[j]
		body := l.text
		indent := l.indent
		if j == start {
			body, indent = itemBody(l.text), keyIndent
		}
		if indent != keyIndent {
			continue
		}
		key, rest := splitKey(body)
		switch key {
		case "command", "args":
			words, err := sequence(lines, j, rest, keyIndent)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %s: %v", file, l.n, key, err))
			}
			if key == "command" {
				c.Command = append(words, c.Command...)
			} else {
				c.Command = append(c.Command, words...)
			}
		case "env":
			if rest != "" {
				if rest != "[]" {
					errs = append(errs, fmt.Errorf("%s:%d: env is written in flow style; the check reads block lists only", file, l.n))
				}
				continue
			}
			for _, it := range items(lines, j+1, blockEnd(lines, j, keyIndent)) {
				v, ok := envName(lines, it[0], it[1])
				if !ok {
					errs = append(errs, fmt.Errorf("%s:%d: env entry without a name", file, lines[it[0]].n))
					continue
				}
				seen[v.Line] = true
				c.Env = append(c.Env, v)
			}
		case "envFrom":
			errs = append(errs, fmt.Errorf("%s:%d: envFrom: the check cannot see the variables it sets; list them under env", file, l.n))
		}
	}
	if len(c.Command) == 0 && hasConcord(c.Env) {
		errs = append(errs, fmt.Errorf("%s:%d: a container sets CONCORD_ variables but names no command: the check cannot tell which command reads them", file, c.Line))
	}
	return c, errors.Join(errs...)
}

func hasConcord(env []EnvVar) bool {
	for _, e := range env {
		if strings.HasPrefix(e.Name, "CONCORD_") {
			return true
		}
	}
	return false
}

// envName returns the env entry whose list item spans lines[start:end], and whether it has a name.
func envName(lines []line, start, end int) (EnvVar, bool) {
	var v EnvVar
	keyIndent := itemKeyIndent(lines, start)
	for j := start; j < end; j++ {
		body, indent := lines[j].text, lines[j].indent
		if j == start {
			body, indent = itemBody(body), keyIndent
		}
		if indent != keyIndent {
			continue
		}
		switch key, rest := splitKey(body); key {
		case "name":
			v.Name, v.Line = unquote(rest), lines[j].n
		case "value":
			v.Value = unquote(rest)
		}
	}
	return v, v.Name != ""
}

// sequence reads the value of a command or args key: a flow sequence on the key's line, or a block
// sequence on the lines below it.
func sequence(lines []line, at int, rest string, keyIndent int) ([]string, error) {
	if rest != "" {
		if !strings.HasPrefix(rest, "[") || !strings.HasSuffix(rest, "]") {
			return nil, fmt.Errorf("want a list, got %q", rest)
		}
		inner := strings.TrimSpace(rest[1 : len(rest)-1])
		if inner == "" {
			return nil, nil
		}
		var words []string
		for _, w := range splitFlow(inner) {
			words = append(words, unquote(strings.TrimSpace(w)))
		}
		return words, nil
	}
	var words []string
	for _, it := range items(lines, at+1, blockEnd(lines, at, keyIndent)) {
		if it[1]-it[0] != 1 {
			return nil, fmt.Errorf("line %d: a list item of more than one line", lines[it[0]].n)
		}
		words = append(words, unquote(itemBody(lines[it[0]].text)))
	}
	return words, nil
}

// splitFlow splits the inside of a flow sequence at commas outside quotes.
func splitFlow(s string) []string {
	var out []string
	var quote byte
	startAt := 0
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case quote != 0:
			if ch == quote {
				quote = 0
			}
		case ch == '"' || ch == '\'':
			quote = ch
		case ch == ',':
			out = append(out, s[startAt:i])
			startAt = i + 1
		}
	}
	return append(out, s[startAt:])
}

// blockEnd returns the index of the first line after lines[at] that is no longer inside the value of
// the key at keyIndent on lines[at]: less indented, or as indented but not a list item (YAML lets a
// block list sit at its key's indentation).
func blockEnd(lines []line, at, keyIndent int) int {
	for j := at + 1; j < len(lines); j++ {
		l := lines[j]
		if l.indent < keyIndent || (l.indent == keyIndent && !isItem(l.text)) || l.text == "---" {
			return j
		}
	}
	return len(lines)
}

// items splits lines[start:end] into list items: the spans from each line starting "- " at the
// first such line's indentation.
func items(lines []line, start, end int) [][2]int {
	var out [][2]int
	indent := -1
	for j := start; j < end; j++ {
		if !isItem(lines[j].text) {
			continue
		}
		if indent == -1 {
			indent = lines[j].indent
		}
		if lines[j].indent != indent {
			continue
		}
		if len(out) > 0 {
			out[len(out)-1][1] = j
		}
		out = append(out, [2]int{j, end})
	}
	return out
}

// itemKeyIndent returns the indentation of the keys of the list item (or key) starting at lines[at]:
// where its first key begins after the "- " markers, or the next line's for a bare "-".
func itemKeyIndent(lines []line, at int) int {
	l := lines[at]
	if itemBody(l.text) == "" && at+1 < len(lines) {
		return lines[at+1].indent
	}
	return l.indent + len(l.text) - len(itemBody(l.text))
}

func isItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// itemBody returns text without its list item marker(s) ("- - a" gives "a").
func itemBody(text string) string {
	for isItem(text) {
		text = strings.TrimLeft(strings.TrimPrefix(text, "-"), " ")
	}
	return text
}

// splitKey splits "key: value" into its key and value; a line that is no mapping entry gives "", "".
func splitKey(text string) (key, value string) {
	i := strings.Index(text, ":")
	if i <= 0 || (i+1 < len(text) && text[i+1] != ' ') {
		return "", ""
	}
	return unquote(strings.TrimSpace(text[:i])), strings.TrimSpace(text[i+1:])
}

// unquote removes one pair of matching single or double quotes.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// stripComment removes a # comment: one that starts the line or follows a space, outside quotes.
func stripComment(s string) string {
	var quote byte
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case quote != 0:
			if ch == quote {
				quote = 0
			}
		case ch == '"' || ch == '\'':
			quote = ch
		case ch == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t'):
			return s[:i]
		}
	}
	return s
}

// CheckEnv checks the containers of the manifests in fsys that run app (whose Program is app.Name):
// each must name a command path of app with no flags after it (they are configured through the
// environment only), and each CONCORD_ variable it sets must be one a flag on that path reads. It
// returns how many containers it checked, and every problem found.
func CheckEnv(fsys fs.FS, app *cli.App) (int, error) {
	cs, err := ReadContainers(fsys)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, c := range cs {
		if c.Program() != app.Name {
			continue
		}
		n++
		read, err := envOnPath(app, c.Command[1:])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %v", c.File, c.Line, err))
			continue
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "CONCORD_") && !read[e.Name] {
				errs = append(errs, fmt.Errorf("%s:%d: %s is set, but `%s` reads no such variable",
					c.File, e.Line, e.Name, strings.Join(c.Command, " ")))
			}
		}
	}
	return n, errors.Join(errs...)
}

// envOnPath returns the environment variables read by the flags on the command path args (after the
// program name) of app: the app's own flags and those of each command along the path.
func envOnPath(app *cli.App, args []string) (map[string]bool, error) {
	read := map[string]bool{}
	addFlags(read, app.Flags)
	cmds, action := app.Commands, app.Action != nil
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("argument %q: configure the command through its CONCORD_ variables, not flags", a)
		}
		var next *cli.Command
		for _, c := range cmds {
			if c.HasName(a) {
				next = c
			}
		}
		if next == nil {
			return nil, fmt.Errorf("argument %q is not a command of %s", a, app.Name)
		}
		addFlags(read, next.Flags)
		cmds, action = next.Subcommands, next.Action != nil
	}
	if !action {
		return nil, fmt.Errorf("%s %s names no command that runs", app.Name, strings.Join(args, " "))
	}
	return read, nil
}

func addFlags(read map[string]bool, flags []cli.Flag) {
	for _, f := range flags {
		if ef, ok := f.(interface{ GetEnvVars() []string }); ok {
			for _, v := range ef.GetEnvVars() {
				read[v] = true
			}
		}
	}
}
