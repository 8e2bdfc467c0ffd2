package config

import (
	"os"

	"github.com/homelab/bootstrap/notify"
)

// NotifyURLs returns the notification URLs postcheck.notify names: the
// lines of urlsFile, or the words of the variable urlsEnv names (none when
// neither is set or the variable is empty).
func (c *Config) NotifyURLs() ([]string, error) {
	n := c.Postcheck.Notify
	switch {
	case n.URLsFile != "":
		b, err := os.ReadFile(c.Resolve(n.URLsFile))
		if err != nil {
			return nil, Userf("postcheck.notify.urlsFile: %v", err)
		}
		return notify.Parse(string(b)), nil
	case n.URLsEnv != "":
		env := os.LookupEnv
		if c.src != nil && c.src.env != nil {
			env = c.src.env
		}
		v, _ := env(n.URLsEnv)
		return notify.Parse(v), nil
	}
	return nil, nil
}

// notify checks postcheck.notify: one source of URLs, a variable name that
// is a name (not a URL pasted there, which would then be printed), and
// URLs shoutrrr can send to (named by position and service only).
func (v *validator) notify() {
	n := v.c.Postcheck.Notify
	if n.URLsFile != "" && n.URLsEnv != "" {
		v.errf("postcheck.notify", "set only one of urlsFile and urlsEnv")
		return
	}
	if n.URLsEnv != "" && !envName.MatchString(n.URLsEnv) {
		v.errf("postcheck.notify.urlsEnv", "must be the name of an environment variable (letters, digits, _), not its value: the URLs carry credentials and belong in the variable")
		return
	}
	if n.URLsFile != "" {
		if _, ok := v.secretFile("postcheck.notify.urlsFile", n.URLsFile); !ok {
			return
		}
	}
	urls, err := v.c.NotifyURLs()
	if err != nil {
		v.errf("postcheck.notify", "%v", err)
		return
	}
	if n.URLsFile != "" && len(urls) == 0 {
		v.errf("postcheck.notify.urlsFile", "%s holds no notification URL", n.URLsFile)
		return
	}
	if err := notify.Check(urls); err != nil {
		field := "postcheck.notify.urlsFile"
		if n.URLsEnv != "" {
			field = "postcheck.notify.urlsEnv"
		}
		v.errf(field, "%v", err)
	}
}
