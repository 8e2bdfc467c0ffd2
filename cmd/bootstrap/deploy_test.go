package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// TestShippedUnitsParse keeps the shipped systemd and cron examples in step
// with the CLI: their bootstrap command lines must parse.
func TestShippedUnitsParse(t *testing.T) {
	lines := map[string]string{}
	for _, f := range []string{"bootstrap-postcheck.service", "bootstrap-gitsnap.service"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", f))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "\\\n", " ")
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "ExecStart=") {
				lines[f] = strings.TrimPrefix(l, "ExecStart=")
			}
		}
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "cron", "bootstrap-postcheck"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, "&& bootstrap "); i >= 0 {
			lines["cron"] = strings.SplitN(l[i+3:], " >", 2)[0]
		}
	}
	if len(lines) != 3 {
		t.Fatalf("command lines found: %v", lines)
	}
	for name, line := range lines {
		args := strings.Fields(line)[1:]
		var cli CLI
		p, err := newParser(&cli, kong.Exit(func(int) { t.Fatalf("%s: kong exited", name) }))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Parse(args); err != nil && !strings.Contains(err.Error(), "existingdir") && !strings.Contains(err.Error(), "no such file") {
			t.Errorf("%s: %q does not parse: %v", name, line, err)
		}
		if strings.Contains(line, "postcheck") && (cli.Run.Stage != "postcheck") {
			t.Errorf("%s: not a postcheck run: %q", name, line)
		}
	}
}
