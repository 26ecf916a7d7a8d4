package mapper_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/peers/dbpeer"
)

// secretDir writes a mounted Secret's keys under a sink secrets directory.
func secretDir(t *testing.T, name string, keys map[string]string) string {
	t.Helper()
	secrets := t.TempDir()
	if err := os.MkdirAll(filepath.Join(secrets, name), 0o700); err != nil {
		t.Fatal(err)
	}
	for k, v := range keys {
		if err := os.WriteFile(filepath.Join(secrets, name, k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return secrets
}

// TestRedisSink: a pushMethod's dbMethod.redis adds each changed reading
// to the sorted set <namespace>/<device>/<property> of its database,
// scored by read time, signing in with the mounted Secret's password (a
// wrong one refused, counted and logged once, the fixed one used at the
// next connect), as redis-cli reads back; while the server is down the readings wait in the
// buffer (the twin goes on) and arrive, in order, once it is back.
func TestRedisSink(t *testing.T) {
	redis := dbpeer.StartRedis(t, "s3cret")
	secrets := secretDir(t, "redis-creds", map[string]string{"password": "wrong"})
	pm := &dmiv1beta1.PushMethod{DowseSecretName: "redis-creds", DbMethod: &dmiv1beta1.DBMethod{Redis: &dmiv1beta1.DBMethodRedis{
		RedisClientConfig: &dmiv1beta1.RedisClientConfig{Addr: redis.Addr(), Db: 2}}}}
	dev := thermo(t, "a", "A", mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, PushMethod: pm})
	r := startSinks(t, dev, func(c *mapper.Config) { c.SinkSecretsDir = secrets })
	labels := `kind="redis",address="redis://` + redis.Addr() + `/2"`
	values := func() ([]string, error) {
		out, err := redis.CLI(2, "ZRANGE", "ns/a/temp", "0", "-1", "WITHSCORES")
		if err != nil {
			return nil, fmt.Errorf("redis-cli: %w: %s", err, out)
		}
		var got []string
		lines := strings.Fields(out)
		for i := 0; i+1 < len(lines); i += 2 {
			member, score := lines[i], lines[i+1]
			if !strings.Contains(member, `"timestamp":`+score+`}`) || !strings.HasPrefix(member, `{"namespace":"ns","device":"a","property":"temp","value":"`) {
				return nil, fmt.Errorf("member %s scored %s: want the reading's JSON scored by its timestamp", member, score)
			}
			got = append(got, strings.SplitN(strings.SplitN(member, `"value":"`, 2)[1], `"`, 2)[0])
		}
		return got, nil
	}
	wantValues := func(want ...string) {
		t.Helper()
		waitUntil(t, "redis holds the readings", func() error {
			got, err := values()
			if err != nil {
				return err
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				return fmt.Errorf("ZRANGE ns/a/temp = %q, want %q", got, want)
			}
			return nil
		})
	}
	r.agent.WaitReported(t, "ns/a", "temp", "1", 0, wait)
	waitUntil(t, "the wrong password refused", func() error {
		if n := r.metrics.Value("dowse_mapper_sink_refused_total", labels); n == 0 {
			return fmt.Errorf("no refusal counted")
		}
		return nil
	})
	if n := r.logs.count("the sink refuses readings"); n != 1 {
		t.Errorf("refused logins logged %d times, want once a minute", n)
	}
	if err := os.WriteFile(filepath.Join(secrets, "redis-creds", "password"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.set(t, 2)
	wantValues("1", "2")

	redis.Stop()
	for v := 3.0; v <= 5; v++ {
		r.set(t, v) // the twin goes on
	}
	waitUntil(t, "the outage seen", func() error {
		if n := r.metrics.Value("dowse_mapper_sink_errors_total", labels); n == 0 {
			return fmt.Errorf("no sink error counted")
		}
		return nil
	})
	redis.Start()
	wantValues("1", "2", "3", "4", "5")
	if n := r.metrics.Value("dowse_mapper_sink_dropped_total", labels); n != 0 {
		t.Errorf("dropped = %v, want 0", n)
	}
}

// TestMySQLSink: a pushMethod's dbMethod.mysql writes each changed
// reading as a row (ts with milliseconds, field the value) of the table
// `<namespace>/<device>/<property>`, made when missing, in a real MariaDB,
// as userName with the mounted Secret's password, as the mariadb client
// reads back; a server restart loses nothing the buffer held.
func TestMySQLSink(t *testing.T) {
	db := dbpeer.StartMariaDB(t, "plant", "mapper", "pw")
	secrets := secretDir(t, "db-creds", map[string]string{"password": "pw"})
	pm := &dmiv1beta1.PushMethod{DowseSecretName: "db-creds", DbMethod: &dmiv1beta1.DBMethod{Mysql: &dmiv1beta1.DBMethodMySQL{
		MysqlClientConfig: &dmiv1beta1.MySQLClientConfig{Addr: db.Addr(), Database: "plant", UserName: "mapper"}}}}
	dev := thermo(t, "a", "A", mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, PushMethod: pm})
	r := startSinks(t, dev, func(c *mapper.Config) { c.SinkSecretsDir = secrets })
	labels := `kind="mysql",address="mysql://` + db.Addr() + `/plant"`
	wantRows := func(want ...string) {
		t.Helper()
		waitUntil(t, "the table holds the readings", func() error {
			out, err := db.SQL("SELECT field, DATE_FORMAT(ts, '%f') FROM plant.`ns/a/temp` ORDER BY id")
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				if f := strings.Split(l, "\t"); len(f) == 2 {
					got = append(got, f[0])
					if len(f[1]) != 6 || !strings.HasSuffix(f[1], "000") {
						return fmt.Errorf("ts fraction %q: want milliseconds", f[1])
					}
				}
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				return fmt.Errorf("rows = %q, want %q", got, want)
			}
			return nil
		})
	}
	r.agent.WaitReported(t, "ns/a", "temp", "1", 0, wait)
	r.set(t, 2)
	wantRows("1", "2")

	db.Stop()
	for v := 3.0; v <= 5; v++ {
		r.set(t, v)
	}
	waitUntil(t, "the outage seen", func() error {
		if n := r.metrics.Value("dowse_mapper_sink_errors_total", labels); n == 0 {
			return fmt.Errorf("no sink error counted")
		}
		return nil
	})
	db.Start()
	wantRows("1", "2", "3", "4", "5")
	if n := r.metrics.Value("dowse_mapper_sink_refused_total", labels); n != 0 {
		t.Errorf("refused = %v, want 0", n)
	}
}
