package io.twopc.flink.testing;

import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ThreadLocalRandom;

/**
 * The throw-away PostgreSQL server of the tests ({@code scripts/postgres.sh
 * start}, which {@code scripts/test.sh} runs), seen from Java: its URL split
 * into the pieces the sink and JDBC want, and the administrator's view of
 * tables and prepared transactions. Shared by the native-bridge tests, the
 * Flink ITs and the demo ({@code --destination postgres}).
 *
 * <p>Without {@code TWOPC_PG_URL} the tests fail and say how to start the
 * server: a silently skipped exactly-once test is worse than a red one.
 */
public final class TestPostgres {
    public static final String URL_VARIABLE = "TWOPC_PG_URL";

    /** As exported, e.g. {@code postgres://twopc:pw@127.0.0.1:54329/twopc}. */
    public final String url;
    public final String host;
    public final int port;
    public final String database;
    public final String user;
    public final String password;

    private TestPostgres(String url) {
        this.url = url;
        URI uri = URI.create(url);
        String userInfo = uri.getRawUserInfo();
        if (!"postgres".equals(uri.getScheme()) && !"postgresql".equals(uri.getScheme())
                || userInfo == null || uri.getHost() == null) {
            throw new AssertionError(URL_VARIABLE + " must look like postgres://user:password@host:port/db, "
                    + "as scripts/postgres.sh prints it");
        }
        int colon = userInfo.indexOf(':');
        this.user = decode(colon < 0 ? userInfo : userInfo.substring(0, colon));
        this.password = colon < 0 ? null : decode(userInfo.substring(colon + 1));
        this.host = uri.getHost();
        this.port = uri.getPort() < 0 ? 5432 : uri.getPort();
        this.database = uri.getPath().replaceFirst("^/", "");
    }

    /** The server named by {@code TWOPC_PG_URL}; fails the test, saying what to run, when unset. */
    public static TestPostgres fromEnvironment() {
        String url = System.getenv(URL_VARIABLE);
        if (url == null || url.trim().isEmpty()) {
            throw new AssertionError(URL_VARIABLE + " is not set: this needs a PostgreSQL server. Run\n"
                    + "    eval \"$(bash scripts/postgres.sh start)\"\n"
                    + "in the shell that runs the tests (or pass -PpgUrl=... to Gradle), or run scripts/test.sh, "
                    + "which starts one.");
        }
        return new TestPostgres(url.trim());
    }

    /** The URL with the password left out, for tests that pass the password separately. */
    public String urlWithoutPassword() {
        return "postgres://" + user + "@" + host + ":" + port + "/" + database;
    }

    /** A name unique to this test run (tests share one server). */
    public static String uniqueName(String prefix) {
        return prefix + "_" + Long.toHexString(ThreadLocalRandom.current().nextLong() & 0xffff_ffffL);
    }

    public Connection connect() throws SQLException {
        Properties props = new Properties();
        props.setProperty("user", user);
        if (password != null) {
            props.setProperty("password", password);
        }
        return DriverManager.getConnection("jdbc:postgresql://" + host + ":" + port + "/" + database, props);
    }

    public void execute(String sql) throws SQLException {
        try (Connection c = connect(); Statement s = c.createStatement()) {
            s.execute(sql);
        }
    }

    public long count(String table) throws SQLException {
        return queryLongs("SELECT count(*) FROM " + table).get(0);
    }

    /** The first column of every row, as longs. */
    public List<Long> queryLongs(String sql) throws SQLException {
        List<Long> out = new ArrayList<>();
        try (Connection c = connect(); Statement s = c.createStatement(); ResultSet r = s.executeQuery(sql)) {
            while (r.next()) {
                out.add(r.getLong(1));
            }
        }
        return out;
    }

    /** The first column of every row, as strings. */
    public List<String> queryStrings(String sql) throws SQLException {
        List<String> out = new ArrayList<>();
        try (Connection c = connect(); Statement s = c.createStatement(); ResultSet r = s.executeQuery(sql)) {
            while (r.next()) {
                out.add(r.getString(1));
            }
        }
        return out;
    }

    /** Gids of the prepared transactions of sink {@code sinkId} (twopc's transaction ids). */
    public List<String> preparedTransactions(String sinkId) throws SQLException {
        return queryStrings("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE '" + sinkId.replace("'", "''")
                + ".%' ORDER BY gid");
    }

    /** What an administrator does to a prepared transaction the sink still needs. */
    public void rollbackPrepared(String gid) throws SQLException {
        execute("ROLLBACK PREPARED '" + gid.replace("'", "''") + "'");
    }

    /** Rolls back whatever sink {@code sinkId} left prepared, so a failed test does not hold locks. */
    public void rollbackAllPrepared(String sinkId) throws SQLException {
        for (String gid : preparedTransactions(sinkId)) {
            try {
                rollbackPrepared(gid);
            } catch (SQLException ignored) {
                // Finished meanwhile: nothing left to clean.
            }
        }
    }

    private static String decode(String s) {
        try {
            return URLDecoder.decode(s, StandardCharsets.UTF_8.name());
        } catch (java.io.UnsupportedEncodingException e) {
            throw new AssertionError(e);
        }
    }
}
