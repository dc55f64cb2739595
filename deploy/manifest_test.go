package deploy

import (
	"bytes"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/urfave/cli/v2"
)

// TestManifests reads the shipped manifests: each sets CONCORD_ variables only in containers that
// run master or peer, and the master and the peers are both there.
func TestManifests(t *testing.T) {
	cs, err := ReadContainers(Manifests)
	if err != nil {
		t.Fatal(err)
	}
	programs := map[string]int{}
	for _, c := range cs {
		if !hasConcord(c.Env) {
			continue
		}
		switch c.Program() {
		case "master", "peer":
			programs[c.Program()]++
		default:
			t.Errorf("%s:%d: a container runs %q and sets CONCORD_ variables; only master and peer read them", c.File, c.Line, c.Command)
		}
	}
	if programs["master"] != 1 || programs["peer"] != 1 {
		t.Errorf("containers per program: %v, want one master and one peer", programs)
	}
	env := map[string]map[string]EnvVar{} // program, name: entry
	for _, c := range cs {
		if c.Program() == "peer" && !slices.Equal(c.Command, []string{"peer", "train"}) {
			t.Errorf("peer container runs %q, want [peer train]", c.Command)
		}
		env[c.Program()] = map[string]EnvVar{}
		for _, e := range c.Env {
			env[c.Program()][e.Name] = e
		}
	}
	// Both ends agree on what they must share, and the peers find the master where it listens.
	m, p := env["master"], env["peer"]
	for _, name := range []string{"CONCORD_TRANSPORT", "CONCORD_SECRET_FILE", "CONCORD_PRESET"} {
		if m[name].Value == "" || m[name].Value != p[name].Value {
			t.Errorf("%s: master %q, peer %q; want one value on both", name, m[name].Value, p[name].Value)
		}
	}
	if m["CONCORD_TRANSPORT"].Value != "tls" {
		t.Errorf("transport %q, want tls", m["CONCORD_TRANSPORT"].Value)
	}
	for _, e := range []EnvVar{m["CONCORD_TOKEN"], p["CONCORD_TOKEN"]} {
		if e.Name == "" || e.Value != "" {
			t.Errorf("token %+v: want one from the Secret (valueFrom), not a value", e)
		}
	}
	if !strings.HasSuffix(m["CONCORD_LISTEN"].Value, ":48148") || p["CONCORD_MASTER"].Value != "concord-master:48148" {
		t.Errorf("master listens on %q, peers dial %q; want port 48148 through the Service concord-master",
			m["CONCORD_LISTEN"].Value, p["CONCORD_MASTER"].Value)
	}
	if m["CONCORD_HTTP"].Value != "0.0.0.0:48180" {
		t.Errorf("status page on %q, want 0.0.0.0:48180 (the Service's http port)", m["CONCORD_HTTP"].Value)
	}
}

func names(env []EnvVar) []string {
	var out []string
	for _, e := range env {
		out = append(out, e.Name)
	}
	return out
}

func TestParseContainers(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []Container
	}{
		{
			name: "flow command, block env, secret ref, comments",
			src: `# CONCORD_IN_COMMENT is fine in a comment
apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      containers:
        - name: master   # the master
          image: concord:latest
          command: ["master"]
          env:
            - name: CONCORD_LISTEN
              value: "0.0.0.0:48148"  # CONCORD_NOT_THIS
            - name: "CONCORD_TOKEN"
              valueFrom:
                secretKeyRef:
                  name: run
                  key: token
            - name: GOMAXPROCS
              value: "2"
`,
			want: []Container{{Line: 8, Command: []string{"master"},
				Env: []EnvVar{{"CONCORD_LISTEN", 12, "0.0.0.0:48148"}, {"CONCORD_TOKEN", 14, ""}, {"GOMAXPROCS", 19, "2"}}}},
		},
		{
			name: "block command and args, lists at the key's indentation, init container, bare item",
			src: `spec:
  initContainers:
  - name: wait
    command:
    - /usr/local/bin/peer
  containers:
  -
    name: peer
    command:
    - /usr/local/bin/peer
    args:
    - 'run'
    env:
    - name: CONCORD_SIZE
      value: "65536"
    - value: x
      name: CONCORD_STEPS
  - name: sidecar
    command: [ "sh", "-c", "echo a, b" ]
---
kind: Service
spec:
  ports:
  - name: peers
`,
			want: []Container{
				{Line: 3, Command: []string{"/usr/local/bin/peer"}},
				{Line: 7, Command: []string{"/usr/local/bin/peer", "run"}, Env: []EnvVar{{"CONCORD_SIZE", 14, "65536"}, {"CONCORD_STEPS", 17, "x"}}},
				{Line: 18, Command: []string{"sh", "-c", "echo a, b"}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseContainers("m.yaml", tc.src)
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				tc.want[i].File = "m.yaml"
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestParseContainersRejects: whatever the check could not follow is an error naming the line.
func TestParseContainersRejects(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"ConfigMap key", "kind: ConfigMap\ndata:\n  CONCORD_TOKEN: x\n", "m.yaml:3: CONCORD_TOKEN outside"},
		{"value naming a variable", "containers:\n  - command: [peer]\n    env:\n      - name: A\n        value: $(CONCORD_X)\n",
			"m.yaml:5: CONCORD_X outside"},
		{"flag in args written as its variable", "containers:\n  - command: [peer, CONCORD_X]\n", "m.yaml:2: CONCORD_X outside"},
		{"envFrom", "containers:\n  - command: [peer]\n    envFrom:\n      - configMapRef: {name: c}\n", "m.yaml:3: envFrom"},
		{"flow env", "containers:\n  - command: [peer]\n    env: [{name: CONCORD_X, value: a}]\n", "m.yaml:3: env is written in flow style"},
		{"no command", "containers:\n  - name: p\n    env:\n      - name: CONCORD_X\n", "m.yaml:2: a container sets CONCORD_ variables but names no command"},
		{"entry without a name", "containers:\n  - command: [peer]\n    env:\n      - value: a\n", "m.yaml:4: env entry without a name"},
		{"command not a list", "containers:\n  - command: peer\n", "m.yaml:2: command: want a list"},
		{"tab", "containers:\n\t- command: [peer]\n", "m.yaml:2: indented with a tab"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseContainers("m.yaml", tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// testApp has app flags, a command with subcommands, and a command that runs.
func testApp() *cli.App {
	return &cli.App{
		Name:  "peer",
		Flags: []cli.Flag{&cli.StringFlag{Name: "log", EnvVars: []string{"CONCORD_LOG"}}},
		Commands: []*cli.Command{
			{Name: "run", Action: func(*cli.Context) error { return nil },
				Flags: []cli.Flag{&cli.IntFlag{Name: "size", EnvVars: []string{"CONCORD_SIZE", "CONCORD_BYTES"}}}},
			{Name: "tool", Subcommands: []*cli.Command{
				{Name: "scan", Aliases: []string{"s"}, Action: func(*cli.Context) error { return nil },
					Flags: []cli.Flag{&cli.BoolFlag{Name: "deep", EnvVars: []string{"CONCORD_DEEP"}}}},
			}},
		},
	}
}

func manifest(command, env string) fstest.MapFS {
	src := "spec:\n  containers:\n    - name: c\n      command: " + command + "\n      env:\n"
	for _, v := range strings.Fields(env) {
		src += "        - name: " + v + "\n          value: x\n"
	}
	return fstest.MapFS{"k/a.yaml": {Data: []byte(src)}, "k/notes.txt": {Data: []byte("CONCORD_IGNORED")}}
}

func TestCheckEnv(t *testing.T) {
	for _, tc := range []struct {
		name, command, env string
		n                  int
		want               []string // substrings of the error; none: no error
	}{
		{"app and command flags", `["/bin/peer", "run"]`, "CONCORD_LOG CONCORD_SIZE CONCORD_BYTES HOME", 1, nil},
		{"nested command by alias", `[peer, tool, s]`, "CONCORD_DEEP CONCORD_LOG", 1, nil},
		{"another command's variable", `[peer, run]`, "CONCORD_DEEP CONCORD_SIZE CONCORD_NONE", 1,
			[]string{"k/a.yaml:6: CONCORD_DEEP is set, but `peer run` reads no such variable", "k/a.yaml:10: CONCORD_NONE"}},
		{"flag argument", `[peer, run, --size=3]`, "CONCORD_SIZE", 1, []string{`a.yaml:3: argument "--size=3": configure`}},
		{"unknown command", `[peer, walk]`, "", 1, []string{`argument "walk" is not a command of peer`}},
		{"no command that runs", `[peer, tool]`, "CONCORD_LOG", 1, []string{"peer tool names no command that runs"}},
		{"the app alone does not run", `[peer]`, "", 1, []string{"names no command that runs"}},
		{"another program is not checked", `[master]`, "CONCORD_NONE", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := CheckEnv(manifest(tc.command, tc.env), testApp())
			if n != tc.n {
				t.Errorf("checked %d containers, want %d", n, tc.n)
			}
			if len(tc.want) == 0 && err != nil {
				t.Errorf("unexpected error: %v", err)
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want one containing %q", err, w)
				}
			}
		})
	}
}

// FuzzParseContainers: any input parses or fails without panicking, and every env entry found is
// the name on its line.
func FuzzParseContainers(f *testing.F) {
	for _, p := range []string{"kubernetes/master.yaml", "kubernetes/peers.yaml"} {
		b, err := Manifests.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("containers:\n-\n  command:\n  - peer\n  env:\n  - name: 'CONCORD_X'\n")
	f.Fuzz(func(t *testing.T, src string) {
		cs, _ := ParseContainers("f.yaml", src)
		lines := strings.Split(src, "\n")
		for _, c := range cs {
			for _, e := range c.Env {
				if e.Line < 1 || e.Line > len(lines) || !strings.Contains(lines[e.Line-1], e.Name) {
					t.Fatalf("env %q at line %d is not on that line", e.Name, e.Line)
				}
			}
			if c.Line < 1 || c.Line > len(lines) {
				t.Fatalf("container at line %d of %d", c.Line, len(lines))
			}
		}
	})
}

// TestDockerfileGo: the Dockerfile's default build image carries the Go release go.mod asks for.
func TestDockerfileGo(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	docker, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	image := regexp.MustCompile(`(?m)^ARG GO_IMAGE=\S*/golang:(\d+\.\d+)[-\s]`).FindSubmatch(docker)
	if goLine == nil || image == nil {
		t.Fatalf("go.mod's go line %q, Dockerfile's ARG GO_IMAGE=.../golang:X.Y %q: one is missing", goLine, image)
	}
	if !bytes.Equal(goLine[1], image[1]) {
		t.Errorf("go.mod asks for Go %s, the Dockerfile builds with golang:%s", goLine[1], image[1])
	}
}
