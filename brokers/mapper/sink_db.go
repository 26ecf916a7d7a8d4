package mapper

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// Database sinks, in the shapes of KubeEdge's dbMethod: each reading is
// one entry, written in batches (one round trip for up to sinkBatch
// readings), and a reading leaves the buffer only once the server took it.
//
//   - redis: ZADD <namespace>/<device>/<property> <read time, Unix ms>
//     <payload JSON>, on database redisClientConfig.db (KubeEdge's
//     mappers name the set after the device alone).
//   - mysql: a row (ts DATETIME(3) UTC, field TEXT: the twin's value) in
//     the table `<namespace>/<device>/<property>` of
//     mysqlClientConfig.database, made when missing with an id BIGINT
//     AUTO_INCREMENT key (KubeEdge's table, with milliseconds).

// dbAddr checks a dbMethod's host:port.
func dbAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q: must be host:port", addr)
	}
	if host == "" {
		return "", fmt.Errorf("%q names no host", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%q: port must be 1-65535", addr)
	}
	return addr, nil
}

// redisTransport writes readings to Redis with go-redis, one pipeline a
// batch. The password (and a user name, for Redis ACLs) comes from the
// sink's credentials; a ca.crt among them turns TLS on.
type redisTransport struct {
	addr    string
	db      int
	creds   credentialSource
	timeout time.Duration
	client  *redis.Client
}

func (t *redisTransport) connect(ctx context.Context) error {
	c, err := t.creds.load()
	if err != nil {
		return err
	}
	opts := &redis.Options{Addr: t.addr, Username: c.username, Password: c.password, DB: t.db,
		// One goroutine writes: one connection. The sink retries with
		// its backoff, never the client.
		PoolSize: 1, MaxRetries: -1, DialTimeout: t.timeout, ReadTimeout: t.timeout, WriteTimeout: t.timeout,
		// RESP2: no HELLO (and no client-side caching) needed.
		Protocol: 2, DisableIdentity: true}
	if len(c.ca) > 0 {
		if opts.TLSConfig, err = c.tlsConfig(); err != nil {
			return err
		}
	}
	client := redis.NewClient(opts)
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		if refusedByRedis(err) {
			return fmt.Errorf("redis %s %w the login: %w", t.addr, errSinkRefused, err)
		}
		return fmt.Errorf("connecting to redis %s: %w", t.addr, err)
	}
	t.client = client
	return nil
}

// refusedByRedis is an answer that the same login gets again.
func refusedByRedis(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "NOAUTH") || strings.HasPrefix(s, "WRONGPASS") || strings.HasPrefix(s, "NOPERM") ||
		strings.Contains(s, "invalid password") || strings.HasPrefix(s, "ERR invalid DB index") || strings.Contains(s, "DB index is out of range")
}

func (t *redisTransport) deliver(ctx context.Context, msgs []*reading) (done, refused int, refusal, err error) {
	pipe := t.client.Pipeline()
	for _, r := range msgs {
		pipe.ZAdd(ctx, r.topic, redis.Z{Score: float64(r.at), Member: r.payload})
	}
	cmds, _ := pipe.Exec(ctx)
	for i, c := range cmds {
		err := c.Err()
		if err == nil {
			continue
		}
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			// Not an answer: the connection failed; what follows waits.
			return i, refused, refusal, fmt.Errorf("writing to redis %s: %w", t.addr, err)
		}
		// The server's answer to this reading (e.g. WRONGTYPE: the key
		// holds something else): sending it again gets it again.
		refused++
		refusal = fmt.Errorf("redis %s %w the reading for %s: %w", t.addr, errSinkRefused, msgs[i].topic, err)
	}
	return len(msgs), refused, refusal, nil
}

func (t *redisTransport) close() {
	if t.client != nil {
		t.client.Close()
		t.client = nil
	}
}

// mysqlTransport writes readings to MySQL or MariaDB with
// go-sql-driver/mysql: per batch, one multi-row INSERT for each run of
// readings of one table. The user is the sink's credentials' username,
// else mysqlClientConfig.userName.
type mysqlTransport struct {
	addr, database, user string
	creds                credentialSource
	timeout              time.Duration
	db                   *sql.DB
	tables               map[string]bool // made on this connection
	query                strings.Builder
	args                 []any
}

func (t *mysqlTransport) connect(ctx context.Context) error {
	c, err := t.creds.load()
	if err != nil {
		return err
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", t.addr, t.database
	cfg.User, cfg.Passwd = t.user, c.password
	if c.username != "" {
		cfg.User = c.username
	}
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = t.timeout, t.timeout, t.timeout
	cfg.Loc = time.UTC
	if len(c.ca) > 0 {
		tc, err := c.tlsConfig()
		if err != nil {
			return err
		}
		host, _, _ := net.SplitHostPort(t.addr)
		tc.ServerName = host
		cfg.TLS = tc
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("mysql %s: %w", t.addr, err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		var me *mysql.MySQLError
		if errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1049) {
			// Access denied, to the server or the database; no such database.
			return fmt.Errorf("mysql %s %w the login: %w", t.addr, errSinkRefused, err)
		}
		return fmt.Errorf("connecting to mysql %s: %w", t.addr, err)
	}
	t.db, t.tables = db, map[string]bool{}
	return nil
}

// quoteIdent quotes a MySQL identifier.
func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

func (t *mysqlTransport) deliver(ctx context.Context, msgs []*reading) (done, refused int, refusal, err error) {
	for done < len(msgs) {
		table := msgs[done].topic
		end := done + 1
		for end < len(msgs) && msgs[end].topic == table {
			end++
		}
		err := t.insert(ctx, table, msgs[done:end])
		var me *mysql.MySQLError
		switch {
		case err == nil:
		case errors.As(err, &me):
			// The server's answer to these readings (a table name too
			// long, a value refused): sending them again gets it again.
			refused += end - done
			refusal = fmt.Errorf("mysql %s %w the readings for %s: %w", t.addr, errSinkRefused, table, err)
		default:
			return done, refused, refusal, fmt.Errorf("writing to mysql %s: %w", t.addr, err)
		}
		done = end
	}
	return done, refused, refusal, nil
}

func (t *mysqlTransport) insert(ctx context.Context, table string, msgs []*reading) error {
	if !t.tables[table] {
		if _, err := t.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+quoteIdent(table)+
			" (id BIGINT AUTO_INCREMENT PRIMARY KEY, ts DATETIME(3) NOT NULL, field TEXT)"); err != nil {
			return err
		}
		t.tables[table] = true
	}
	t.query.Reset()
	t.query.WriteString("INSERT INTO ")
	t.query.WriteString(quoteIdent(table))
	t.query.WriteString(" (ts, field) VALUES ")
	t.args = t.args[:0]
	for i, r := range msgs {
		if i > 0 {
			t.query.WriteByte(',')
		}
		t.query.WriteString("(?,?)")
		t.args = append(t.args, time.UnixMilli(r.at).UTC(), r.value)
	}
	_, err := t.db.ExecContext(ctx, t.query.String(), t.args...)
	clear(t.args)
	return err
}

func (t *mysqlTransport) close() {
	if t.db != nil {
		t.db.Close()
		t.db = nil
	}
}
